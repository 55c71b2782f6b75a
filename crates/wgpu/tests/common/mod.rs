//! What every wgpu integration test shares: [`deltakv_wgpu::testing::device`].

pub use deltakv_wgpu::testing::device;
