//! Finds the installed DPDK with pkg-config, builds the C shim against it, and generates the
//! bindings from its headers (at build time: DPDK's structures change between releases, and
//! only the installed headers say what the installed libraries expect).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let dpdk = match pkg_config::Config::new()
        .atleast_version("22.11")
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!(
                "error: DPDK not found (pkg-config libdpdk >= 22.11): {e}\n\
                 Install the development package (Debian/Ubuntu: apt-get install libdpdk-dev),\n\
                 or build without the `dpdk` feature."
            );
            std::process::exit(1);
        }
    };
    let mut cc = cc::Build::new();
    cc.file("shim/shim.c").include("shim").opt_level(3);
    for p in &dpdk.include_paths {
        cc.include(p);
    }
    // DPDK's headers need its configuration first and the target's vector extensions.
    cc.flag("-include")
        .flag("rte_config.h")
        .flag("-march=corei7");
    cc.warnings(false);
    cc.compile("ina_dpdk_shim");

    let mut b = bindgen::Builder::default()
        .header("shim/shim.h")
        .clang_arg("-include")
        .clang_arg("rte_config.h")
        .clang_arg("-march=corei7")
        .allowlist_function("ina_.*")
        .allowlist_function("rte_eal_(init|cleanup)")
        .allowlist_function("rte_dev_probe")
        .allowlist_function("rte_thread_(register|unregister)")
        .allowlist_function("rte_eth_(dev_count_avail|dev_get_port_by_name|dev_info_get|dev_configure|rx_queue_setup|tx_queue_setup|dev_start|dev_stop|dev_close|dev_socket_id|macaddr_get|promiscuous_enable|stats_get|dev_set_mtu|link_get_nowait)")
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_mempool_free")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_socket_id")
        .allowlist_var("RTE_MBUF_DEFAULT_BUF_SIZE|RTE_PKTMBUF_HEADROOM|RTE_MAX_ETHPORTS")
        .opaque_type("rte_mbuf")
        .opaque_type("rte_mempool")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for p in &dpdk.include_paths {
        b = b.clang_arg(format!("-I{}", p.display()));
    }
    // bindgen panics when it cannot load libclang: say which package brings it instead (and
    // keep the panic's own report and backtrace out of the way while it is caught).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || b.generate()))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("bindgen panicked");
            eprintln!(
                "error: generating the DPDK bindings needs libclang: {what}\n\
             Install it (Debian/Ubuntu: apt-get install libclang-dev), or build without the\n\
             `dpdk` feature."
            );
            std::process::exit(1);
        });
    std::panic::set_hook(default_hook);
    let bindings = generated.unwrap_or_else(|e| {
        eprintln!("error: generating the DPDK bindings failed: {e}");
        std::process::exit(1);
    });
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing the bindings");
}
