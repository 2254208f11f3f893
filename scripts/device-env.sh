# shellcheck shell=sh
# Sourced (POSIX sh) by the device bundle's `mt` runner, where it is the bundle's env.sh, and
# by scripts/device-run.sh. Puts the bundle's lib/ first on LD_LIBRARY_PATH, then the folders
# of the device's CUDA libraries that the bundle was linked against (MANIFEST.txt's
# from_device line: libcublasLt.so.13, libnccl.so.2, ...), each looked for in, in order:
#   $MT_CUDA_LIBDIRS (colon-separated, yours), /usr/local/cuda/lib64,
#   /usr/local/cuda/targets/x86_64-linux/lib, PyTorch's nvidia-* wheels (site-packages/
#   nvidia/**/lib of python3), /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu
# In: MT_BUNDLE (the unpacked bundle; default: $here, the sourcing script's folder).
# Out: LD_LIBRARY_PATH, MT_CUDA_FOUND ("soname=folder ..."), MT_CUDA_MISSING ("soname ...").
MT_BUNDLE=${MT_BUNDLE:-${here:-.}}
export MT_BUNDLE

mt_site_dirs() {
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 &&
      "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null
  done
  for d in /opt/torch/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages \
           /usr/lib/python3/dist-packages; do
    [ -d "$d" ] && echo "$d"
  done
}

# mt_find_lib SONAME: prints the first folder holding SONAME
mt_find_lib() {
  _ifs=$IFS
  IFS=:
  for d in ${MT_CUDA_LIBDIRS:-} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -n "$d" ] && [ -e "$d/$1" ] && { IFS=$_ifs; echo "$d"; return 0; }
  done
  IFS=$_ifs
  for s in $(mt_site_dirs | awk '!seen[$0]++'); do
    [ -d "$s/nvidia" ] || continue
    f=$(find "$s/nvidia" -maxdepth 4 -name "$1" 2>/dev/null | sort | head -n 1)
    [ -n "$f" ] && { dirname "$f"; return 0; }
  done
  for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$1" ] && { echo "$d"; return 0; }
  done
  return 1
}

mt_libpath=$MT_BUNDLE/lib
MT_CUDA_FOUND=""
MT_CUDA_MISSING=""
mt_need=""
[ -f "$MT_BUNDLE/MANIFEST.txt" ] &&
  mt_need=$(sed -n 's/^from_device: *//p' "$MT_BUNDLE/MANIFEST.txt")
for so in $mt_need; do
  if d=$(mt_find_lib "$so"); then
    MT_CUDA_FOUND="$MT_CUDA_FOUND $so=$d"
    case ":$mt_libpath:" in *":$d:"*) ;; *) mt_libpath=$mt_libpath:$d ;; esac
  else
    MT_CUDA_MISSING="$MT_CUDA_MISSING $so"
  fi
done
# The driver (libcuda.so.1, dlopened by the static CUDA runtime) is normally on the loader's
# path already; add its usual folder in case it is not.
[ -e /usr/local/nvidia/lib64/libcuda.so.1 ] &&
  case ":$mt_libpath:" in *":/usr/local/nvidia/lib64:"*) ;; *) mt_libpath=$mt_libpath:/usr/local/nvidia/lib64 ;; esac
LD_LIBRARY_PATH=$mt_libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH MT_CUDA_FOUND MT_CUDA_MISSING
unset mt_libpath mt_need so d
