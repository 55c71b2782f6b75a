// Lab variants of the prepare kernel: copies of the library's prepare_impl with one change
// each (keeping the library's PF_MARK phase points), added to `run_variants` and
// `report_phases`. Variants measured so far and their outcomes are in docs/cuda-kernel-log.md.

template <typename Run>
void run_variants(Run& run, int smem) {
    (void)run;
    (void)smem;
}

static void phases_of(const char* name, void (*kernel)(PrefillParams), const PrefillParams& p,
                      int chunks, int heads, int smem) {
    const size_t blocks = (size_t)chunks * heads;
    long long* clocks;
    CHECK(cudaMalloc(&clocks, blocks * 8 * sizeof(long long)));
    CHECK(cudaMemset(clocks, 0, blocks * 8 * sizeof(long long)));
    CHECK(cudaMemcpyToSymbol(lab_phase_clock, &clocks, sizeof clocks));
    PrefillParams q = p;
    void *w, *u, *gates;
    const size_t wu = (size_t)chunks * heads * 64 * 128;
    CHECK(cudaMalloc(&w, wu * 2));
    CHECK(cudaMalloc(&u, wu * 2));
    CHECK(cudaMalloc(&gates, (size_t)chunks * heads * PF_GATES_BYTES));
    q.w = (u64)w, q.u = (u64)u, q.gates = (u64)gates;
    kernel<<<dim3(chunks, heads), 256, smem>>>(q);
    CHECK(cudaDeviceSynchronize());
    std::vector<long long> host(blocks * 8);
    CHECK(cudaMemcpy(host.data(), clocks, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    const char* names[7] = {"load+gates", "A", "diag inverse", "off-diagonal", "W", "U", "total"};
    double sum[7] = {0};
    for (size_t b = 0; b < blocks; ++b) {
        for (int i = 0; i < 6; ++i) sum[i] += (double)(host[b * 8 + i + 1] - host[b * 8 + i]);
        sum[6] += (double)(host[b * 8 + 6] - host[b * 8]);
    }
    printf("%s: mean cycles per block by phase (blocks share an SM):", name);
    for (int i = 0; i < 7; ++i) printf("  %s %.0f", names[i], sum[i] / blocks);
    printf("\n");
    long long* none = nullptr;
    CHECK(cudaMemcpyToSymbol(lab_phase_clock, &none, sizeof none));
    CHECK(cudaFree(clocks));
    CHECK(cudaFree(w));
    CHECK(cudaFree(u));
    CHECK(cudaFree(gates));
}

static void report_phases(const PrefillParams& p, int chunks, int heads, int smem) {
    phases_of("library", gdn_prefill_prepare_k128_v128, p, chunks, heads, smem);
}
