// A token's expert routing as llama.cpp's graph does it, by one subgroup (moe_router.comp,
// and mul_mat_vecq's ROUTE): the n_used largest scores, largest first, lowest index on ties,
// into route_id and their weights into route_w (written by lane 0).
//   softmax_k 0 (qwen3moe, mixtral): the scores are the softmax over all logits, the
//     weights those probabilities, divided by their sum when norm.
//   softmax_k 1 (gpt-oss): the scores are the logits themselves, the weights the softmax
//     over the n_used chosen ones alone.
// The includer defines ROUTE_LOGIT(i), the token's logit of expert i, and a shared float
// route_prob[] of n_expert or more. Lane l owns experts l, l + SG, ...: no other lane reads
// them, so no barrier is needed.
const uint ROUTE_MAX_USED = 32;
const float ROUTE_TAKEN = -1.0 / 0.0;       // below every score (logits are finite)
shared uint route_id[ROUTE_MAX_USED];
shared float route_w[ROUTE_MAX_USED];

void route(uint n_expert, uint n_used, uint norm, uint softmax_k) {
    const uint lane = gl_SubgroupInvocationID, sgs = gl_SubgroupSize;
    if (softmax_k != 0) {
        for (uint e = lane; e < n_expert; e += sgs) route_prob[e] = ROUTE_LOGIT(e);
    } else {
        float m = -1.0 / 0.0;
        for (uint e = lane; e < n_expert; e += sgs) m = max(m, ROUTE_LOGIT(e));
        m = subgroupMax(m);
        float s = 0.0;
        for (uint e = lane; e < n_expert; e += sgs) {
            route_prob[e] = exp(ROUTE_LOGIT(e) - m);
            s += route_prob[e];
        }
        const float inv = 1.0 / subgroupAdd(s);
        for (uint e = lane; e < n_expert; e += sgs) route_prob[e] *= inv;
    }

    float sum = 0.0;
    for (uint j = 0; j < n_used; j++) {
        float best = ROUTE_TAKEN;
        uint best_e = 0xFFFFFFFFu;
        for (uint e = lane; e < n_expert; e += sgs) {
            if (route_prob[e] > best) { best = route_prob[e]; best_e = e; }
        }
        const float v = subgroupMax(best);
        const uint pick = subgroupMin(best == v ? best_e : 0xFFFFFFFFu);
        if (pick % sgs == lane) route_prob[pick] = ROUTE_TAKEN;
        if (lane == 0) {
            route_id[j] = pick;
            route_w[j] = v;
        }
        sum += v;
    }
    if (lane != 0) return;
    if (softmax_k != 0) {
        // ggml_soft_max over the chosen logits: exp(x - max), times 1 / their sum
        const float m = route_w[0];
        float s = 0.0;
        for (uint j = 0; j < n_used; j++) {
            route_w[j] = exp(route_w[j] - m);
            s += route_w[j];
        }
        const float inv = 1.0 / s;
        for (uint j = 0; j < n_used; j++) route_w[j] *= inv;
        return;
    }
    // ggml clamps the sum at the smallest normal half before dividing
    const float div = norm != 0 ? max(sum, 6.103515625e-5) : 1.0;
    for (uint j = 0; j < n_used; j++) route_w[j] /= div;
}
