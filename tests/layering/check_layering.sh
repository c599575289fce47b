#!/usr/bin/env bash
# The layout holds by construction: each folder library includes headers only
# of the folders it may depend on (the arrows in the README's layout
# section), and torch-free folders include no torch header, neither
# libtorch's own nor the project's torch-facing ones.
#
#   bash tests/layering/check_layering.sh [ROOT]   (default: the repository)
# Prints every offending include as file:line and exits 1 when there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}

# folder -> the project folders its sources may include (and its library may link).
declare -A allowed=(
  [core]=""
  [registry]="core"
  [capture]="core registry selection"
  [selection]="core registry"
  [crawler]="core registry"
  [backends]="core"
  [replay]="core backends"
  [isolation]="core replay"
  [stages]="core registry capture backends replay isolation"
  [reports]="core registry"
  [apps]="core registry capture selection crawler backends replay isolation stages reports"
  [sim]="backends"
  [tools]="core"
)
# Folders whose sources must not see torch at all.
torch_free="core registry capture selection crawler isolation stages reports apps tools"
# Folders whose libraries must not link libtorch either, directly or through
# a torch-facing library of the project.
torch_free_links="core registry capture selection crawler isolation reports tools"
torch_libraries="coverage_replay coverage_backends coverage_backends_torch coverage_torch_openmp TORCH_LIBRARIES"
# The project's torch-facing headers (they include ATen); every other header
# of backends/ and replay/ is torch-free.
torch_headers="backends/backend.h backends/dtype_map.h backends/pch.h replay/call_engine.h replay/compare.h replay/materialize.h replay/reference_upcast.h replay/replayer.h"

bad=0
for folder in "${!allowed[@]}"; do
  dir=$root/$folder
  [[ -d $dir ]] || continue
  if [[ ! -f $dir/CMakeLists.txt || ! -f $dir/README.md ]]; then
    echo "$folder/: every folder library has its own CMakeLists.txt and README.md"
    bad=1
  fi
  while IFS= read -r hit; do
    [[ -n $hit ]] || continue
    file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; text=${rest#*:}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$text")
    dep=${inc%%/*}
    [[ $inc == */* ]] || continue       # a header beside the file
    [[ $dep == "$folder" ]] && continue
    if [[ -d $root/$dep && " ${allowed[$folder]} " != *" $dep "* ]]; then
      echo "${file#"$root"/}:$line: $folder/ must not include $inc ($folder/ may use: ${allowed[$folder]:-nothing})"
      bad=1
    fi
    if [[ " $torch_free " == *" $folder "* && " $torch_headers " == *" $inc "* ]]; then
      echo "${file#"$root"/}:$line: $folder/ is torch-free and must not include the torch-facing $inc"
      bad=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$dir" --include='*.h' --include='*.cc' || true)
  if [[ " $torch_free " == *" $folder "* ]]; then
    while IFS= read -r hit; do
      [[ -n $hit ]] || continue
      file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
      echo "${file#"$root"/}:$line: $folder/ is torch-free and must not include libtorch headers"
      bad=1
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+<(ATen|c10|torch)/' "$dir" --include='*.h' --include='*.cc' || true)
  fi
done
for folder in $torch_free_links; do
  cmake=$root/$folder/CMakeLists.txt
  [[ -f $cmake ]] || continue
  for lib in $torch_libraries; do
    while IFS= read -r line; do
      [[ -n $line ]] || continue
      echo "$folder/CMakeLists.txt:${line%%:*}: $folder/ is torch-free and must not link $lib"
      bad=1
    done < <(grep -nE "target_link_libraries|^[[:space:]]+(PUBLIC|PRIVATE|INTERFACE)" "$cmake" | grep -w -- "$lib" | grep -vE '^[0-9]+:[[:space:]]*#' || true)
  done
done
if ((bad == 0)); then echo "layering: ok (${#allowed[@]} folders)"; fi
exit $bad
