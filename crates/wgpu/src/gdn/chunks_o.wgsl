// The chunked state pass's o, written through atomics (with store_o.wgsl): two 16-bit outputs
// share a word, and neighbouring heads' columns may fall in one word (odd V), written by
// different workgroups.
@group(0) @binding(9) var<storage, read_write> o: array<atomic<u32>>;
