//! The `deltakv` command-line tool.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    quiet_vulkan_device_select();
    match cli::run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Turns off Mesa's implicit Vulkan layer `VK_LAYER_MESA_device_select` for this process,
/// unless the user configured it (`MESA_VK_DEVICE_SELECT`) or decided (`NODEVICE_SELECT`).
/// Asked for the device list, the layer connects to a Wayland display to find the screen's GPU,
/// and without one libwayland prints `error: XDG_RUNTIME_DIR is invalid or not set in the
/// environment.` twice, an error line in every wgpu run that is not one: deltakv picks its
/// adapter itself (`DELTAKV_WGPU_ADAPTER`, else the high-performance one).
fn quiet_vulkan_device_select() {
    if std::env::var_os("NODEVICE_SELECT").is_none()
        && std::env::var_os("MESA_VK_DEVICE_SELECT").is_none()
    {
        // SAFETY: the first thing `main` does, before this process starts any thread, so no
        // other thread reads or writes the environment meanwhile.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}
