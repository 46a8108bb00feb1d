// Shared by every kernel: extensions and the per-step values written by the host.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable

// The step buffer: values that change per submit (per decoded token, per prefill chunk)
// live here so recorded command buffers stay valid. RunState.set_step (engine/gpu/ops.py)
// writes them.
#define STEP_BUFFER(b) layout(std430, binding = b) readonly buffer Step { uint pos0; uint n_past; uint step_pad0; uint step_pad1; } step;
