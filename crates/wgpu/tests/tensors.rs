//! `WgpuTensor`: host round trips of every dtype at odd element counts (16-bit tensors end in
//! half a word), poisoned buffers whose every byte is 0xFF, copies on the device, and the
//! checks on a caller's buffer.

mod common;

use deltakv_contract::{DType, HostTensor};
use deltakv_wgpu::WgpuTensor;

#[test]
fn host_round_trips_poison_and_device_copies() {
    let Some(wgpu) = common::device("tensors") else {
        return;
    };
    let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.75 - 9.0).collect();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let host = HostTensor::from_f32_as(vec![37], &values, dtype).unwrap();
        let on_device = WgpuTensor::upload(wgpu, &host).unwrap();
        assert_eq!(on_device.download(wgpu).unwrap(), host, "{dtype}");
        let copy = on_device.copy(wgpu).unwrap();
        assert_eq!(copy.download(wgpu).unwrap(), host, "{dtype} copy");
    }
    // A caller's buffer larger than its tensor: the copy takes the tensor's bytes only.
    let host = HostTensor::from_f32(vec![5], values[..5].to_vec()).unwrap();
    let big = wgpu.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("caller's buffer"),
        size: 256,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    wgpu.queue().write_buffer(&big, 0, &host.to_le_bytes());
    let wrapped = WgpuTensor::from_buffer(big, vec![5], DType::F32).unwrap();
    let copy = wrapped.copy(wgpu).unwrap();
    assert_eq!(
        copy.download(wgpu).unwrap(),
        host,
        "copy of a wrapped buffer"
    );
    for host in [
        HostTensor::from_i32(vec![3], vec![-1, 7, 0]).unwrap(),
        HostTensor::from_i64(vec![2], vec![-5, 1 << 40]).unwrap(),
    ] {
        let on_device = WgpuTensor::upload(wgpu, &host).unwrap();
        assert_eq!(on_device.download(wgpu).unwrap(), host);
    }
    // Large enough for a two-dimensional fill grid on adapters with 65535 workgroups per row.
    for (shape, dtype) in [
        (vec![5, 3], DType::BF16),
        (vec![7], DType::F32),
        (vec![65536 * 256 + 3], DType::F32),
    ] {
        let poisoned = WgpuTensor::poisoned(wgpu, shape.clone(), dtype).unwrap();
        let bytes = poisoned.download(wgpu).unwrap().to_le_bytes();
        assert!(bytes.iter().all(|&b| b == 0xFF), "{shape:?} {dtype}");
        let zeros = WgpuTensor::zeros(wgpu, shape.clone(), dtype).unwrap();
        let bytes = zeros.download(wgpu).unwrap().to_le_bytes();
        assert!(bytes.iter().all(|&b| b == 0), "{shape:?} {dtype}");
    }
    let small = WgpuTensor::zeros(wgpu, vec![2], DType::F32).unwrap();
    let err = WgpuTensor::from_buffer(small.buffer().clone(), vec![3], DType::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot hold"), "{err}");
    let view = WgpuTensor::from_buffer(small.buffer().clone(), vec![2], DType::F32).unwrap();
    assert_eq!(view.download(wgpu).unwrap().to_le_bytes(), vec![0; 8]);
}

#[test]
fn copy_reference_runs_both_copies() {
    let Some(wgpu) = common::device("copy rates") else {
        return;
    };
    let rates = deltakv_wgpu::timing::copy_rates(wgpu, 4 << 20).unwrap();
    println!(
        "copy on {}: shader {:.4} TB/s, copy_buffer_to_buffer {:.4} TB/s",
        wgpu.name(),
        rates.shader,
        rates.buffer
    );
    for rate in [rates.shader, rates.buffer] {
        assert!(rate.is_finite() && rate > 0.0, "{rates:?}");
    }
    assert_eq!(rates.best(), rates.shader.max(rates.buffer));
}
