// The matrix-unit tile of mul_mat_cm.comp and mul_mat_moe_cm.comp: acc (BM weight rows x BN
// columns of x) += W[w0 + row0 ..] . x^T on 16x16 f16 products with f32 sums. Four subgroups
// (2 x 2) each own (BM/2) x (BN/2). Per step of BK = 64 along K, lanes dequantize whole chunks
// of W rows (chunk.glsl) and convert x to f16 into shared memory; the next step's global loads
// are issued before this step's products, so they overlap. The sums leave through a small
// per-subgroup staging area.
// The includer declares BM, BN, x4, p.n_in, p.n_out and chunk.glsl's bindings, and defines
//   uint x_row(uint t)                     vec4 offset of tile column t's row of x (t < live)
//   void put(uint t, uint row, float v)    one sum out: tile column t, row of this part's W
// before the include. The arrays are private globals, as tile.glsl's.
const uint BK = 64, BK4 = BK / 4, S4 = BK4 + 2;   // f16vec4s per row, padded
const uint CPR = BK / CHUNK;                       // chunks of a row per step: 1 or 2
const uint MF = BM / 32, NF = BN / 32;             // 16x16 tiles per subgroup
shared f16vec4 As[BM * S4];                       // W tile, row-major: rows x k
shared f16vec4 Bs[BN * S4];                       // x tile, column-major: columns x k
shared float Cs[4 * 256];                         // per subgroup: one 16x16 tile of sums

#define ACCUM coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
const uint A_TASKS = BM * CPR, A_PER = (A_TASKS + 127) / 128;     // chunks per lane
const uint B_PER = BN * BK4 / 128;                                 // vec4s of x per lane

vec4 wa[A_PER][NV];
vec4 xb[B_PER];
ACCUM acc[MF][NF];

// W rows w0 + row0 .. (clamped to the part's rows), and the tile's live columns of x
void fetch(uint k0, uint w0, uint row0, uint live, uint nc) {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + 128 * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            const uint row = w0 + min(row0 + r, p.n_out - 1);
            dequant_chunk(row * nc + k0 / CHUNK + c, wa[i]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + 128 * i;
        const uint t = u / BK4, v = u % BK4;
        xb[i] = t < live ? x4[x_row(t) + k0 / 4 + v] : vec4(0.0);
    }
}

void stash() {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + 128 * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            [[unroll]] for (uint v = 0; v < NV; v++) As[r * S4 + c * NV + v] = f16vec4(wa[i][v]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + 128 * i;
        Bs[(u / BK4) * S4 + u % BK4] = f16vec4(xb[i]);
    }
}

// acc = the tile's sums over all of K
void tile_product(uint w0, uint row0, uint live) {
    const uint sm = gl_SubgroupID & 1, sn = gl_SubgroupID >> 1;   // this subgroup's quarter
    const uint nc = p.n_in / CHUNK;
    [[unroll]] for (uint i = 0; i < MF; i++)
        [[unroll]] for (uint j = 0; j < NF; j++) acc[i][j] = ACCUM(0.0);

    fetch(0, w0, row0, live, nc);
    for (uint k0 = 0; k0 < p.n_in; k0 += BK) {
        barrier();                                        // the last step's reads are done
        stash();
        barrier();
        if (k0 + BK < p.n_in) fetch(k0 + BK, w0, row0, live, nc);
        [[unroll]] for (uint kk = 0; kk < BK4; kk += 4) {   // 16 k at a time
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[MF];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
            [[unroll]] for (uint i = 0; i < MF; i++)
                coopMatLoad(a[i], As, (sm * BM / 2 + i * 16) * S4 + kk, S4,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < NF; j++) {    // K x N from column-major rows
                coopMatLoad(b, Bs, (sn * BN / 2 + j * 16) * S4 + kk, S4,
                            gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < MF; i++)
                    acc[i][j] = coopMatMulAdd(a[i], b, acc[i][j]);
            }
        }
    }
}

// put() every sum of rows row0 .. of the part (row < n_out) and live columns
void tile_store(uint row0, uint live) {
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint sm = sg & 1, sn = sg >> 1;
    // tile (i, j): rows row0 + sm*BM/2 + 16i .., columns sn*BN/2 + 16j ..; Cs column-major
    [[unroll]] for (uint i = 0; i < MF; i++) {
        [[unroll]] for (uint j = 0; j < NF; j++) {
            coopMatStore(acc[i][j], Cs, sg * 256, 16, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint q = 0; q < 8; q++) {
                const uint idx = lane + 32 * q;          // column idx / 16, row idx % 16
                const uint t = sn * BN / 2 + j * 16 + idx / 16;
                const uint row = row0 + sm * BM / 2 + i * 16 + idx % 16;
                if (t < live && row < p.n_out) put(t, row, Cs[sg * 256 + idx]);
            }
            subgroupBarrier();
        }
    }
}
