#!/usr/bin/env bash
# The op observer's backlog on the GPU, in one call on a two-GPU machine (carry .whl): the build,
# the PyTorch test files (each in its own process), then issue 32's DDP step in lockstep
# (bench_ddp --lockstep): scripts/gpu_checker_run.sh without bench_models.
#   bash scripts/gpu_backlog_run.sh [DDP_ROUNDS]
# Brings back: build.txt, status.txt, logs.tgz, bench_ddp_lockstep.txt (under ${OUT:-out}).
NO_MODELS=1 exec bash scripts/gpu_checker_run.sh 0 "${1:-20}"
