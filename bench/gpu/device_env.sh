# shellcheck shell=bash
# The GPU scripts' shared set-up (scripts/gpu_run.sh device,
# bench/gpu/run_checksum_ab.sh, run_staged.sh, run_two_nodes.sh), sourced
# from the repo root, where .devbundle (scripts/gpu_run.sh build) lies:
#   . bench/gpu/device_env.sh
# Sourcing only defines the functions below; each script calls those it needs.

# OUT: where results go (default ./gpu-out), created.
wsync_gpu_out() {
  OUT=${OUT:-$PWD/gpu-out}
  mkdir -p "$OUT"
}

# The bundle's libraries and CUDA's first on LD_LIBRARY_PATH; NVLink
# multicast off (it must stay off on the shared GPU hosts).
wsync_device_env() {
  export LD_LIBRARY_PATH=$PWD/.devbundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

# The machine, on stdout: the date and every GPU (index, name, driver,
# memory), then what the arguments ask for, in this order: topo (the GPU
# topology matrix), nccl (the NCCL library CUDA's lib64 holds), torch
# (torch's and its NCCL's versions).
wsync_env_lines() {
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  [[ " $* " == *" topo "* ]] && nvidia-smi topo -m
  [[ " $* " == *" nccl "* ]] &&
    ls /usr/local/cuda/lib64 | grep -E 'libnccl\.so\.[0-9.]+$' | sed 's/^/nccl lib: /'
  [[ " $* " == *" torch "* ]] &&
    python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' 2>&1
  return 0
}

# A step's timeout under a whole-run budget: `wsync_budget_start S` starts a
# budget of S seconds; `wsync_budget_timeout N` prints min(N, seconds left)
# and fails (prints nothing) once less than one second is left, so that
# `t=$(wsync_budget_timeout 90) && timeout "$t" ...` keeps every step, and so
# the run, inside the budget (`timeout 0` would mean no limit at all).
wsync_budget_start() {
  WSYNC_BUDGET_END=$((SECONDS + $1))
}
wsync_budget_timeout() {
  local left=$((WSYNC_BUDGET_END - SECONDS))
  [ "$left" -ge 1 ] || return 1
  echo $(($1 < left ? $1 : left))
}
