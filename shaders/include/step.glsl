// The step buffer: values that change per submit (per decoded token, per prefill chunk) live
// here so recorded command buffers stay valid; RunState.set_step (engine/gpu/ops.py) writes
// them. The block is shaders/registry.py's STEP_FIELDS (a test holds the two together) and
// its binding the kernel's KernelSpec.step, which compile.py passes as STEP_BINDING.
#ifndef STEP_BINDING
#error "STEP_BINDING comes from the kernel's registry entry (KernelSpec.step)"
#endif
layout(std430, binding = STEP_BINDING) readonly buffer Step {
    uint pos0;         // position of the pass's first token
    uint n_past;       // positions in the KV cache once this pass is in
    uint bidir;        // 1: the pass's tokens see each other both ways (keys up to n_past - 1),
                       // as llama.cpp's non-causal batch of an image's embeddings
    uint step_pad1;
    // per token of a packed pass (read only by kernels specialized with SEQS = 1): the cache
    // slot where the token's sequence starts. Its position is its slot minus that, and it
    // sees keys from that slot on: several sequences in one pass (embeddings)
    uint seq_first[];
} step;
