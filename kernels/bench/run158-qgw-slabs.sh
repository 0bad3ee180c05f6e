#!/bin/bash
# run 158 (one GPU): the 64-row AWQ wgmma GEMM with a warpgroup per 64 columns sharing the token
# tile (wg64x128/64/4: 256 threads, wg64x256/64/4: 512), against run 157's one-warpgroup
# wg64x64/64/4 (64 rows read the activations once per 64 columns from L2: four times the
# weights' bytes). qgemm_tune checks every shape against the tiled kernel; then four V3 layers in
# AWQ (64 experts) at batch 64 with each shape forced for the dense GEMMs (every dense GEMM of the
# step has 64 rows).
# `timeout 570 bash kernels/bench/run158-qgw-slabs.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-158}
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
timeout 300 $C kernels-check --stages qgemm_tune > $OUT/run$R-tune-full.txt 2>&1
echo "tune rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-tune-full.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-tune-full.txt | head -5 | cut -c1-200
grep -E "^  awq g64 (V3|V2-Lite) .* 64 rows" $OUT/run$R-tune-full.txt | cut -c1-190
grep -E "^qgp awq g64 (wg)?64x" $OUT/run$R-tune-full.txt | grep -E "V3 (o_proj|q_b|mlp gate/up) 64" | cut -c1-150
wait
for s in 64x64 64x128 64x256; do
  BENCH_TIMEOUT=60 bench_steps v3l4-$s $C v3l4 64 CLEAVE_QGEMM=persistent:wg$s/64/4
  grep -hE "profile decode batch 64:" $OUT/run$R-v3l4-$s.txt | grep -oE "(kernels [0-9.]+ ms|qg[pw]64[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo
done
