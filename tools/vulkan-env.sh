# Sourced (`. tools/vulkan-env.sh`) on the GPU machine from the repo root, before anything runs
# through wgpu there: unpacks the Vulkan loader and GL dispatch libraries carried in
# .carry/vulkan (`tools/gpu-check.sh build` downloads them), names NVIDIA's ICD where the image
# keeps it outside the loader's search path, and gives wgpu a runtime directory. Used by
# `tools/gpu-check.sh`'s wgpu modes; a one-off call script sources it rather than repeating it.
for deb in .carry/vulkan/*.deb; do dpkg -x "$deb" /; done
ldconfig
if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 &&
    [ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
