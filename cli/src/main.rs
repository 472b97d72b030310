//! `ina`: one command for the whole stack.
//!
//! `ina bench` compares in-network aggregation through the software switch against a ring
//! all-reduce (and measures the switch against a plain UDP reflector); `ina switch` runs the
//! software switch daemon; `ina worker` runs one worker process; `ina sim` runs the
//! deterministic simulator; `ina testbed` builds an emulated rack of network namespaces;
//! `ina controller` runs the controller, and `ina job` and `ina switch add|list|drain` talk to
//! it. The subcommands only parse flags and drive the libraries.
//!
//! A command that fails prints `error: ` and the chain of causes on one line to stderr, never
//! a backtrace (whatever `RUST_BACKTRACE` says: these are configuration and usage errors, not
//! bugs), and exits with status 2, as clap does for flags it cannot parse.

mod bench;
mod cmd_controller;
mod cmd_sim;
mod cmd_switch;
mod cmd_switch_ports;
mod cmd_testbed;
mod cmd_worker;
mod data;
mod dpdk_args;
mod mem;
mod sim_cluster;
mod sim_sweep;

use clap::{Parser, Subcommand};

/// In-network gradient aggregation: software switch, workers, benchmark and simulator.
#[derive(Debug, Parser)]
#[command(name = "ina", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmark in-network aggregation against a ring all-reduce (the default job).
    Bench(bench::BenchArgs),
    /// Run the software switch daemon; or, with add|list|drain, manage the controller's
    /// switches.
    Switch(Box<cmd_switch::SwitchArgs>),
    /// Run the controller: slot pools for many jobs on many switches (HTTP/JSON API).
    Controller(cmd_controller::ControllerArgs),
    /// Create, list, show or delete jobs through the controller.
    Job(cmd_controller::JobArgs),
    /// Run one worker: all-reduce generated tensors through a switch or a ring, report as JSON.
    Worker(cmd_worker::WorkerArgs),
    /// Run a scenario in the deterministic simulator.
    Sim(cmd_sim::SimArgs),
    /// Build, inspect or remove an emulated rack of network namespaces (root).
    Testbed(cmd_testbed::TestbedArgs),
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Output piped into a reader that closes early (`ina sim | head`) ends the process as any
/// Unix tool does, instead of failing a `println!` with a panic: the Rust runtime ignores
/// SIGPIPE, and this puts back the default action.
fn quiet_broken_pipe() {
    #[allow(unsafe_code)]
    // SAFETY: setting a signal's disposition to SIG_DFL before any thread is started; no
    // handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> std::process::ExitCode {
    quiet_broken_pipe();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Bench(args) => {
            init_tracing("warn");
            bench::run(args)
        }
        Command::Switch(mut args) => match args.manage.take() {
            Some(manage) => {
                init_tracing("warn");
                cmd_controller::run_switch(manage)
            }
            None => {
                init_tracing("info");
                cmd_switch::run(*args)
            }
        },
        Command::Controller(args) => {
            init_tracing("info");
            cmd_controller::run_daemon(args)
        }
        Command::Job(args) => {
            init_tracing("warn");
            cmd_controller::run_job(args)
        }
        Command::Worker(args) => {
            init_tracing("warn");
            cmd_worker::run(args)
        }
        Command::Sim(args) => {
            init_tracing("warn");
            cmd_sim::run(args)
        }
        Command::Testbed(args) => {
            init_tracing("warn");
            cmd_testbed::run(args)
        }
    }
}
