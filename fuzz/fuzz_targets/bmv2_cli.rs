//! The parsers of `simple_switch_CLI`'s answers (the controller's bmv2 driver reads them):
//! whatever the text, they answer or refuse, never panic.
#![no_main]

use ina_switch_p4::bmv2_cli::{
    parse_created_nodes, parse_mc_dump, parse_num_entries, parse_table_dump,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_table_dump(&text);
    let _ = parse_mc_dump(&text);
    let _ = parse_created_nodes(&text);
    let _ = parse_num_entries(&text);
});
