enable f16;
enable wgpu_cooperative_matrix;
