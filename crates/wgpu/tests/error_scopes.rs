//! Errors are reported per call: one thread's calls that wgpu refuses come back as `Err` to
//! that thread, naming what was being done, while another thread's valid calls through the
//! same shared device keep succeeding, and neither leaves anything for a later check.

mod common;

use deltakv_contract::HostTensor;
use deltakv_wgpu::WgpuTensor;

const ROUNDS: usize = 200;

#[test]
fn a_refused_call_fails_only_on_its_own_thread() {
    let Some(wgpu) = common::device("error scopes") else {
        return;
    };
    let host = HostTensor::from_f32(vec![5], vec![1.0, -2.0, 0.5, 3.25, -7.0]).unwrap();
    std::thread::scope(|s| {
        // A buffer with no usage: wgpu's validation refuses it, inside deltakv's call.
        let failing = s.spawn(|| {
            for round in 0..ROUNDS {
                let err = wgpu
                    .zeroed_buffer("no usage", 16, wgpu::BufferUsages::empty())
                    .expect_err("a buffer without usage was made")
                    .to_string();
                assert!(
                    err.contains("allocating 16 bytes on the device failed: "),
                    "round {round}: {err}"
                );
                assert!(!err.contains('\n'), "round {round}, not one line: {err}");
            }
        });
        let working = s.spawn(|| {
            for round in 0..ROUNDS {
                let back = WgpuTensor::upload(wgpu, &host)
                    .and_then(|t| t.copy(wgpu))
                    .and_then(|t| t.download(wgpu))
                    .unwrap_or_else(|e| panic!("round {round}: another thread's error: {e}"));
                assert_eq!(back, host, "round {round}");
            }
        });
        working.join().expect("the working thread failed");
        failing.join().expect("the failing thread failed");
    });
    // Each error went to the call that raised it, none to the fallback that check reports.
    wgpu.check("after both threads").unwrap();
}
