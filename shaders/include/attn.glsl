// The options every attention kernel takes. Each declares, beside its own:
//   a push constant `softcap` (0: none), and
//   the constant SINKS with a readonly buffer `sinks` of one F32 logit per query head.
// soft_cap: a score capped as gemma2's are, cap * tanh(s / cap), after the scale (ggml scales
// by 1 / cap, takes tanh, scales by cap). tanh's argument is clamped so that no driver's
// exp-based tanh overflows: tanh(15) is 1 in float.
float soft_cap(float s, float cap) {
    return cap > 0.0 ? tanh(clamp(s * (1.0 / cap), -15.0, 15.0)) * cap : s;
}
// A sink (gpt-oss): one more logit per head that joins the softmax's max and sum and
// attends to nothing. Online softmaxes start from it: running max = sink, running sum = 1.
