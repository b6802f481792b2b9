# Sourced by the one-call device scripts (gpu_session.sh, and split_session.sh on its branch):
#   session_begin OUT_DIR NAME   logs go to OUT_DIR/NAME/ and come back as OUT_DIR/NAME.tgz however the
#                                script ends (the device tool returns at most 8 files); defines $out.
#   step TITLE                   a timestamped section header.
session_begin() {
  archive_dir=$1
  archive_name=$2
  out="$archive_dir/$archive_name"
  mkdir -p "$out"
  trap 'tar czf "$archive_dir/$archive_name.tgz" -C "$archive_dir" "$archive_name" && rm -rf "$out" && echo "logs: $archive_name.tgz"' EXIT
  export PYTHONUNBUFFERED=1
}
step() { echo "== $1 ($(date +%T))"; }
