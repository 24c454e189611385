# The model flag sets that the multi-process tests (tests/parallel, tests/checkpoint) share.
# MLA_FLAGS: multi-latent attention with YaRN (values narrower than the queries: 8 against 16).
set(MLA_FLAGS --multi-latent-attention --q-lora-rank 16 --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 8
    --v-head-dim 8 --qk-layernorm --rotary-scaling-factor 4 --mscale 1 --mscale-all-dim 1)
# MUON_FLAGS: Muon, with RMSNorm: a LayerNorm's key bias has no true gradient, so Adam would turn its
# rounding noise into full-size steps.
set(MUON_FLAGS --optimizer muon --muon-fp32-matmul-prec high --apply-wd-to-qk-layernorm --qk-layernorm --normalization RMSNorm)
# MOE_FLAGS: 4 experts, top-2, the first layer dense, aux loss and z-loss; MOE_DEEPSEEK_FLAGS:
# sigmoid scores with expert bias, group-limited top-4 of 8, sequence aux loss, scaling factor, a
# gated shared expert, SwiGLU.
set(MOE_FLAGS --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-layer-freq "([0]+[1]*3)"
    --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3)
set(MOE_DEEPSEEK_FLAGS --num-experts 8 --moe-router-topk 4 --moe-ffn-hidden-size 16 --moe-layer-freq "([0]+[1]*3)"
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2
    --moe-router-num-groups 4 --moe-router-group-topk 2 --moe-router-topk-scaling-factor 2.5
    --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-3 --moe-shared-expert-intermediate-size 32
    --moe-shared-expert-gate --swiglu --disable-bias-linear --moe-router-dtype fp32)
# MTP_FLAGS: one multi-token-prediction layer.
set(MTP_FLAGS --mtp-num-layers 1 --position-embedding-type rope)
# The tensor-parallel overlap's configuration files (tests/parallel/overlap_cfg/*.yaml), FP8's
# looser tolerances against one process, and the rounding an overlap's split GEMMs may change on a
# CPU BLAS (tests/parallel/CMakeLists.txt says why).
set(OVERLAP_CFG ${CMAKE_CURRENT_SOURCE_DIR}/parallel/overlap_cfg)
set(FP8_LOOSE --tolerance 1e-3 --weights-tolerance 2e-2 --tensor-tolerance 0.5)
set(OVERLAP_ROUNDING --without-tolerance 1e-6 --without-weights-tolerance 5e-6 --without-tensor-tolerance 1e-3)
