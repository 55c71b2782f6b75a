// Lab variants of the prepare kernel: copies of the library's prepare_impl with one change
// each (keeping the library's PF_MARK phase points), added to `run_variants` and
// `report_phases`. Variants measured so far and their outcomes are in docs/cuda-kernel-log.md.

template <typename Run>
void run_variants(Run& run, const PrefillParams& p, int smem) {
    (void)run;
    (void)p;
    (void)smem;
}

// Mean cycles per block of each phase (the library's PF_MARK points; see gdn_prefill.cu), the
// per-head phases summed over the block's value heads.
static void report_phases(const char* name, const PrefillParams& p, int chunks, int smem) {
    const int rows = p.key_heads * p.head_groups;
    const size_t blocks = (size_t)chunks * rows;
    const int heads = p.value_heads;
    long long* clocks;
    CHECK(cudaMalloc(&clocks, blocks * LAB_MARKS * sizeof(long long)));
    CHECK(cudaMemset(clocks, 0, blocks * LAB_MARKS * sizeof(long long)));
    CHECK(cudaMemcpyToSymbol(lab_phase_clock, &clocks, sizeof clocks));
    PrefillParams q = p;
    void *w, *u, *gates, *scores;
    // K = V = 128 in the state passes' stage layouts (PF_W_ELEMS).
    CHECK(cudaMalloc(&w, (size_t)chunks * heads * PF_W_ELEMS(128) * 2));
    CHECK(cudaMalloc(&u, (size_t)chunks * heads * 2 * PF_U_TILE_ELEMS * 2));
    CHECK(cudaMalloc(&gates, (size_t)chunks * heads * PF_GATES_BYTES));
    CHECK(cudaMalloc(&scores, (size_t)chunks * heads * PF_SCORES_ELEMS * 2));
    q.w = (u64)w, q.u = (u64)u, q.gates = (u64)gates, q.scores = (u64)scores;
    LAB_REFERENCE<<<dim3(chunks, rows), 256, smem>>>(q);
    CHECK(cudaDeviceSynchronize());
    std::vector<long long> host(blocks * LAB_MARKS);
    CHECK(cudaMemcpy(host.data(), clocks, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    const char* names[7] = {"load+gates", "products+A", "diag inverse", "off-diagonal", "W", "U", "total"};
    double sum[7] = {0};
    const int per_block = p.heads_per_block;  // every block of this lab shape has all its heads
    for (size_t b = 0; b < blocks; ++b) {
        const long long* m = &host[b * LAB_MARKS];
        sum[0] += (double)(m[1] - m[0]);
        long long previous = m[1];
        for (int j = 0; j < per_block; ++j) {
            for (int i = 0; i < 5; ++i) {
                sum[1 + i] += (double)(m[2 + 5 * j + i] - previous);
                previous = m[2 + 5 * j + i];
            }
        }
        sum[6] += (double)(previous - m[0]);
    }
    printf("%s: mean cycles per block by phase (%d value heads each; blocks share an SM):", name,
           per_block);
    for (int i = 0; i < 7; ++i) printf("  %s %.0f", names[i], sum[i] / blocks);
    printf("\n");
    long long* none = nullptr;
    CHECK(cudaMemcpyToSymbol(lab_phase_clock, &none, sizeof none));
    CHECK(cudaFree(clocks));
    CHECK(cudaFree(w));
    CHECK(cudaFree(u));
    CHECK(cudaFree(gates));
    CHECK(cudaFree(scores));
}
