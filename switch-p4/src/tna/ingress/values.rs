//! Stages 4 to 11: the value registers, four per stage.

use super::super::*;

pub(super) fn value_registers(p: &mut P4) {
    for j in 0..VALUE_REGISTERS {
        let (lo, hi) = (2 * j, 2 * j + 1);
        let _ = writeln!(
            p,
            "
    // Twin: Registers::values, elements {lo} and {hi} of (slot, set) at index 2*slot+set.
    Register<pair_t, cell_index_t>(POOL_CELLS) reg_value_{j};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_write_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            v.lo = hdr.payload.e{lo};
            v.hi = hdr.payload.e{hi};
            rv = v.hi;
        }}
    }};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_add_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            v.lo = v.lo + hdr.payload.e{lo};
            v.hi = v.hi + hdr.payload.e{hi};
            rv = v.hi;
        }}
    }};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_read_hi_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.hi;
        }}
    }};
    RegisterAction<pair_t, cell_index_t, bit<32>>(reg_value_{j}) value_read_lo_{j} = {{
        void apply(inout pair_t v, out bit<32> rv) {{
            rv = v.lo;
        }}
    }};"
        );
        // The first table of stage 4 also records the operation it chose for the later stages.
        let record = |op: u8| {
            if j == 0 {
                format!(" md.vop = {op};")
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            p,
            "    action do_value_write_{j}() {{ hdr.payload.e{hi} = value_write_{j}.execute(md.cell);{} }}
    action do_value_add_{j}() {{ hdr.payload.e{hi} = value_add_{j}.execute(md.cell);{} }}
    action do_value_read_hi_{j}() {{ hdr.payload.e{hi} = value_read_hi_{j}.execute(md.cell);{} }}
    action do_value_read_lo_{j}() {{ hdr.payload.e{lo} = value_read_lo_{j}.execute(md.cell);{} }}",
            record(vop::WRITE),
            record(vop::ADD),
            record(vop::READ_HI),
            record(vop::READ_LO),
        );
        let actions = [
            format!("do_value_write_{j}"),
            format!("do_value_add_{j}"),
            format!("do_value_read_hi_{j}"),
            format!("do_value_read_lo_{j}"),
        ];
        let actions: Vec<&str> = actions.iter().map(String::as_str).collect();
        let stage = VALUE_FIRST_STAGE + j / ALUS_PER_STAGE;
        if stage == VALUE_FIRST_STAGE {
            // Stage 4 sees the bitmap of stage 3 as it came out of its ALU: a rank whose bit is
            // set already contributed, and its packet only reads.
            let mut entries = vec![
                entry(
                    &[&vop::WRITE.to_string(), "_", "_"],
                    format!("do_value_write_{j}()"),
                ),
                entry(
                    &[&vop::READ_HI.to_string(), "_", "_"],
                    format!("do_value_read_hi_{j}()"),
                ),
                entry(
                    &[&vop::READ_LO.to_string(), "_", "_"],
                    format!("do_value_read_lo_{j}()"),
                ),
            ];
            for r in 0..MAX_WORKERS {
                let bit = format!("32w0x{:08x} &&& 32w0x{:08x}", 1u32 << r, 1u32 << r);
                entries.push(entry(
                    &[&vop::ADD_IF_UNSEEN.to_string(), &bit, &r.to_string()],
                    format!("do_value_read_hi_{j}()"),
                ));
            }
            // A payload to a use begun by a header (refused): nothing is added.
            entries.push(entry(
                &[
                    &vop::ADD_IF_UNSEEN.to_string(),
                    &format!("{} &&& {}", kind_bit(), kind_bit()),
                    "_",
                ],
                format!("do_value_read_hi_{j}()"),
            ));
            entries.push(entry(
                &[&vop::ADD_IF_UNSEEN.to_string(), "_", "_"],
                format!("do_value_add_{j}()"),
            ));
            table(
                p,
                &format!("value_{j}"),
                Some(stage),
                &[
                    ("md.vop_c", "ternary"),
                    ("md.bm_old", "ternary"),
                    ("hdr.ina.rank", "ternary"),
                ],
                &actions,
                &entries,
                "NoAction()",
            );
        } else {
            let entries = vec![
                entry(&[&vop::WRITE.to_string()], format!("do_value_write_{j}()")),
                entry(&[&vop::ADD.to_string()], format!("do_value_add_{j}()")),
                entry(
                    &[&vop::READ_HI.to_string()],
                    format!("do_value_read_hi_{j}()"),
                ),
                entry(
                    &[&vop::READ_LO.to_string()],
                    format!("do_value_read_lo_{j}()"),
                ),
            ];
            table(
                p,
                &format!("value_{j}"),
                Some(stage),
                &[("md.vop", "exact")],
                &actions,
                &entries,
                "NoAction()",
            );
        }
    }
}
