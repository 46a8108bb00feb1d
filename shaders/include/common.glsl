// Shared by every kernel: extensions. (Kernels reading the per-step values include step.glsl.)
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable
