//! The fast path against the general path, and each compilation against the others.

use super::*;
use crate::pipeline::{JobConfig, JobError, PipelineConfig};
use ina_wire::{AggRepr, MessageType};
use proptest::prelude::*;

/// What a verdict says, without the borrow of the pipeline.
fn owned(v: Verdict<'_>, out: &[u8]) -> Owned {
    match v {
        Verdict::Drop(r) => (Some(r), vec![], vec![]),
        Verdict::Absorbed => (None, vec![], vec![]),
        Verdict::Unicast { port, len } => (None, vec![port], out[..len].to_vec()),
        Verdict::Multicast { ports, len } => (None, ports.to_vec(), out[..len].to_vec()),
    }
}

/// Two jobs (3 and 5) with 4 and 3 workers on an 8-slot pool.
fn two_jobs(elems: u16) -> Result<Pipeline, JobError> {
    let mut p = Pipeline::new(PipelineConfig {
        pool_slots: 8,
        max_elems: 257,
    });
    p.add_job(JobConfig {
        job: 3,
        epoch: 9,
        slot_base: 1,
        slot_count: 4,
        elems_per_packet: elems,
        ranks: (0..4).map(PortId).collect(),
        uplink: None,
    })?;
    p.add_job(JobConfig {
        job: 5,
        epoch: 2,
        slot_base: 5,
        slot_count: 3,
        elems_per_packet: elems,
        ranks: (10..13).map(PortId).collect(),
        uplink: None,
    })?;
    Ok(p)
}

/// One packet the tests send: rank, slot, set, seq, exponent, payload (as the seed of
/// [`payload`]), variant.
type Op = (u8, u16, u8, u32, u8, u64, u8);

/// Element counts: small ones, and the counts the pipeline compiles apart (64, 256).
fn counts() -> impl Strategy<Value = u16> {
    prop_oneof![1u16..=40, Just(64), Just(256)]
}

/// `n` elements drawn from `seed`, with the extremes of int32 among them.
fn payload(seed: u64, n: usize) -> Vec<i32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let z = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            match z % 16 {
                0 => i32::MAX,
                1 => i32::MIN,
                _ => (z >> 32) as i32,
            }
        })
        .collect()
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        (
            0u8..6,
            0u16..9,
            0u8..2,
            0u32..3,
            any::<u8>(),
            any::<u64>(),
            0u8..16,
        ),
        1..150,
    )
}

/// The packet of `op` for [`two_jobs`], the port it arrives on, the length of the reply
/// buffer and the time. Mostly well-formed contributions of both jobs; by `variant`, packets
/// that miss each check of the data fast path (count, type, epoch, port, job, payload
/// length, version, reserved flag), ranks past the job's on the port that pads its table
/// of rank ports, and reply buffers too short for any reply, one byte short of a result,
/// and exactly a result long.
fn packet(op: &Op, elems: u16) -> (PortId, Vec<u8>, usize, Instant) {
    let &(rank, slot, set, seq, exponent, seed, variant) = op;
    let second = slot >= 5;
    let (job, epoch, base_port) = if second { (5, 2, 10) } else { (3, 9, 0) };
    let repr = AggRepr {
        kind: if variant == 3 {
            MessageType::Probe
        } else {
            MessageType::Data
        },
        set,
        gap: None,
        job: if variant == 7 { 4 } else { job },
        epoch: if variant == 4 { epoch + 1 } else { epoch },
        rank,
        exponent,
        slot,
        count: match variant {
            1 => elems - 1,
            2 => 0,
            8 => elems + 1,
            _ => elems,
        },
        seq,
    };
    let mut pkt = vec![0u8; repr.buffer_len()];
    if let Ok(mut view) = repr.emit_into(&mut pkt) {
        let vals = payload(seed, usize::from(repr.count));
        ina_wire::payload::encode_from(&vals, view.payload_mut());
    }
    match variant {
        // A payload shorter, or longer, than the count says.
        9 => pkt.truncate(pkt.len() - 4),
        13 => pkt.extend_from_slice(&[0; 4]),
        10 => pkt[0] = 0x21,  // another version
        11 => pkt[1] |= 0x80, // a reserved flag
        _ => {}
    }
    let port = match variant {
        5 => PortId(base_port + u16::from((rank + 1) % 4)),
        // The port that pads the job's table of rank ports.
        12 => PortId(0),
        _ => PortId(base_port + u16::from(rank)),
    };
    let result_len = HEADER_LEN + 4 * usize::from(elems);
    let out_len = match variant {
        6 => 20,
        14 => result_len - 1,
        15 => result_len,
        _ => HEADER_LEN + 4 * 257,
    };
    (port, pkt, out_len, Instant::from_nanos(u64::from(seq)))
}

/// What a verdict says, and the reply it sent.
type Owned = (Option<DropReason>, Vec<PortId>, Vec<u8>);

/// Sends the packets of `ops` to two pipelines of [`two_jobs`], one through `run_a` and
/// one through `run_b`; fails unless every verdict and reply agrees. Returns both.
fn send_both(
    elems: u16,
    ops: &[Op],
    run_a: impl Fn(&mut Pipeline, PortId, &[u8], Instant, &mut [u8]) -> Owned,
    run_b: impl Fn(&mut Pipeline, PortId, &[u8], Instant, &mut [u8]) -> Owned,
) -> Result<(Pipeline, Pipeline), TestCaseError> {
    let (Ok(mut a), Ok(mut b)) = (two_jobs(elems), two_jobs(elems)) else {
        return Err(TestCaseError::fail("jobs install"));
    };
    for op in ops {
        let (port, pkt, out_len, now) = packet(op, elems);
        let (mut out_a, mut out_b) = (vec![0u8; out_len], vec![0u8; out_len]);
        let va = run_a(&mut a, port, &pkt, now, &mut out_a);
        let vb = run_b(&mut b, port, &pkt, now, &mut out_b);
        prop_assert_eq!(va, vb);
    }
    prop_assert_eq!(a.counters(), b.counters());
    prop_assert_eq!(a.registers(), b.registers());
    Ok((a, b))
}

proptest! {
    /// The data fast path only takes packets the general path would aggregate, and
    /// handles them as it would: the same verdicts, replies, counters, registers and
    /// activity times as the general path alone.
    #[test]
    fn fast_path_agrees_with_the_general_path(elems in counts(), ops in ops()) {
        let (fast, general) = send_both(
            elems,
            &ops,
            |p, port, pkt, now, out| owned(p.process(port, pkt, now, out), out),
            // The general path alone.
            |p, port, pkt, now, out| {
                p.count_arrival(pkt.len());
                owned(p.process_inner::<false>(port, pkt, now, out), out)
            },
        )?;
        for job in [3, 5] {
            prop_assert_eq!(fast.last_activity(job), general.last_activity(job));
        }
    }

    /// The pipeline is compiled for the baseline target, for AVX2 and for AVX-512 (see
    /// `process_dispatch`); every copy the CPU can run takes the same decisions and
    /// computes the same sums as the baseline one (`vector_compilations_checked` says
    /// which copies this CPU checks).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[allow(unsafe_code)]
    fn baseline_and_vector_compilations_agree(elems in counts(), ops in ops()) {
        let baseline =
            |p: &mut Pipeline, port, pkt: &[u8], now, out: &mut [u8]| {
                owned(p.process_baseline::<true>(port, pkt, now, out), out)
            };
        if kernels::has_avx2() {
            // SAFETY: the CPU has AVX2 (checked above).
            send_both(elems, &ops, baseline, |p, port, pkt, now, out| {
                owned(unsafe { p.process_inner_avx2(port, pkt, now, out) }, out)
            })?;
        }
        if Isa::detect() == Isa::Avx512 {
            // SAFETY: the CPU has AVX-512 F, BW and VL (checked above).
            send_both(elems, &ops, baseline, |p, port, pkt, now, out| {
                owned(unsafe { p.process_inner_avx512(port, pkt, now, out) }, out)
            })?;
        }
    }

    /// A burst, whichever compilation runs it, handles a whole sequence of packets as
    /// `process` of the baseline compilation handles them one call at a time: the same
    /// verdicts, replies, counters, registers and activity times.
    #[test]
    fn a_burst_agrees_with_one_call_per_packet(elems in counts(), ops in ops()) {
        let packets: Vec<_> = ops.iter().map(|op| packet(op, elems)).collect();
        let (Ok(mut single), Ok(fresh)) = (two_jobs(elems), two_jobs(elems)) else {
            return Err(TestCaseError::fail("jobs install"));
        };
        single.isa = Isa::Baseline;
        let want: Vec<Owned> = packets
            .iter()
            .map(|(port, pkt, out_len, now)| {
                let mut out = vec![0u8; *out_len];
                owned(single.process(*port, pkt, *now, &mut out), &out)
            })
            .collect();
        for isa in compilations() {
            let mut p = fresh.clone();
            p.isa = isa;
            let got: Vec<Owned> = p.burst(|b| {
                packets
                    .iter()
                    .map(|(port, pkt, out_len, now)| {
                        let mut out = vec![0u8; *out_len];
                        owned(b.process(*port, pkt, *now, &mut out), &out)
                    })
                    .collect()
            });
            prop_assert_eq!(&got, &want, "{:?}", isa);
            prop_assert_eq!(p.counters(), single.counters(), "{:?}", isa);
            prop_assert_eq!(p.registers(), single.registers(), "{:?}", isa);
            for job in [3, 5] {
                prop_assert_eq!(p.last_activity(job), single.last_activity(job));
            }
        }
    }
}

/// The compilations of the pipeline this CPU can run.
fn compilations() -> Vec<Isa> {
    let mut isas = vec![Isa::Baseline];
    let widest = Isa::detect();
    if widest != Isa::Baseline {
        isas.push(Isa::Avx2);
    }
    if widest == Isa::Avx512 {
        isas.push(Isa::Avx512);
    }
    isas
}

/// The compilations the agreement tests above check are every one this CPU can run, as
/// the standard library's own feature detection says (a dispatch that missed a feature
/// would leave that copy unchecked, and unused); which ones those are is printed. A CPU
/// without AVX-512 (or AVX2) cannot run, and so cannot check, those copies.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_compilations_checked() {
    let isas = compilations();
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl");
    assert_eq!(isas.first(), Some(&Isa::Baseline));
    assert_eq!(isas.contains(&Isa::Avx2), avx2 || avx512, "{isas:?}");
    assert_eq!(isas.contains(&Isa::Avx512), avx512, "{isas:?}");
    assert_eq!(kernels::has_avx2(), avx2, "the kernels' own detection");
    println!("compilations checked against the baseline on this CPU: {isas:?}");
    for missing in [Isa::Avx2, Isa::Avx512] {
        if !isas.contains(&missing) {
            println!("not checked here (this CPU cannot run it): {missing:?}");
        }
    }
}
