# Sourced by the run scripts (on the device machine, from the repository root): the CUDA
# libraries, the kernel cache, the carried binaries ($C, $CB) and a helper that starts a server.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
C=.carry/cleave; CB=.carry/cleave-bench
chmod +x $C; [ -f $CB ] && chmod +x $CB

# start_server LOG ARGS...: `cleave serve ARGS` in the background (its pid in $SP); returns once
# it logged "ready at" or died, and prints how long that took.
start_server() {
  local log=$1; shift
  local t0=$(date +%s)
  $C serve "$@" > "$log" 2>&1 &
  SP=$!
  for i in $(seq 1 300); do grep -q "ready at" "$log" && break; kill -0 $SP 2>/dev/null || break; sleep 0.5; done
  echo "serve ready after $(( $(date +%s) - t0 )) s"
}
