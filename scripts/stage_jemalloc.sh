#!/usr/bin/env bash
# Builds the jemalloc that gpumem::pinned links: Debian 12's jemalloc 5.3.0 source package,
# configured like Debian's (4 KiB pages, 2 MiB huge pages) except for three things:
#
#   --disable-initial-exec-tls  jemalloc's thread state becomes global-dynamic TLS, so a library
#                               carrying it (libgpumem_pinned_torch.so) loads into a running process
#                               (Python's dlopen) without glibc's static TLS reserve. Debian's own
#                               build uses initial-exec TLS (2.6 KiB), which a late dlopen cannot get
#                               unless the process started with GLIBC_TUNABLES=glibc.rtld.optional_static_tls.
#   --disable-cxx               no operator new/delete in the archive (gpumem never wants them)
#   --disable-prof, --disable-doc
#
#   scripts/stage_jemalloc.sh [DIR]          (default: .deps/jemalloc, ignored by git)
#
# DIR receives include/jemalloc/jemalloc.h, lib/libjemalloc_pic.a and SOURCE (what was built, how).
# Configure gpumem with -DGPUMEM_JEMALLOC_ROOT=DIR (scripts/setup.sh builds $GPUMEM_DEPS/jemalloc
# and passes it). The public symbols are renamed gpumem_je_* at gpumem's build time
# (pinned/cmake/rename_jemalloc.cmake), as for Debian's archive. A second run with the folder
# present does nothing.
#
# The source comes from Debian's archive through apt-get source, with a private copy of this
# machine's Debian sources (deb-src instead of deb) in a temporary folder: the system's apt
# configuration is not changed. About a minute on two cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/.deps/jemalloc}
version=5.3.0
flags=(--with-lg-page=12 --with-lg-hugepage=21 --disable-initial-exec-tls --disable-cxx --disable-prof
       --disable-doc --disable-shared --with-version=$version-0-g0)

log() { printf '[stage_jemalloc] %s\n' "$*" >&2; }
fail() { log "ERROR: $*"; exit 1; }

if [ -f "$dir/SOURCE" ] && grep -q -- '--disable-initial-exec-tls' "$dir/SOURCE" \
   && [ -f "$dir/lib/libjemalloc_pic.a" ] && [ -f "$dir/include/jemalloc/jemalloc.h" ]; then
  log "$dir is already built ($(head -1 "$dir/SOURCE"))"
  exit 0
fi
for tool in apt-get dpkg-source make cc; do
  command -v "$tool" >/dev/null || fail "$tool is missing (Debian: apt-get install dpkg-dev build-essential)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A private apt state that knows only the source variant of this machine's Debian sources.
mkdir -p "$work/apt/parts" "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
found=0
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  sed -n '/^Types:/!{p;d}; s/^Types:.*/Types: deb-src/p' "$f" >"$work/apt/parts/$(basename "$f")"
  found=1
done
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb \(.*\)/deb-src \1/p' /etc/apt/sources.list >"$work/apt/parts/from-sources.list"
  [ -s "$work/apt/parts/from-sources.list" ] && found=1
fi
[ "$found" = 1 ] || fail "no Debian apt sources found under /etc/apt to derive a source entry from"
apt_opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/parts"
          -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" -o APT::Sandbox::User=root)
log "fetching Debian's jemalloc source package"
timeout 300 apt-get "${apt_opts[@]}" update -qq >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get update (sources) failed"; }
(cd "$work/src" && timeout 300 apt-get "${apt_opts[@]}" source --download-only jemalloc >>"$work/apt.log" 2>&1) \
  || { cat "$work/apt.log" >&2; fail "apt-get source jemalloc failed"; }
dsc=$(ls "$work/src"/jemalloc_*.dsc 2>/dev/null | head -1)
[ -n "$dsc" ] || fail "apt-get source left no jemalloc_*.dsc"
case "$(basename "$dsc")" in
  jemalloc_$version-*) ;;
  *) fail "Debian's source package is $(basename "$dsc"), gpumem::pinned is written against jemalloc $version" ;;
esac
(cd "$work/src" && dpkg-source --no-check -x "$(basename "$dsc")" jemalloc >>"$work/apt.log" 2>&1) \
  || { cat "$work/apt.log" >&2; fail "dpkg-source -x failed"; }

log "building jemalloc $version (${flags[*]})"
cd "$work/src/jemalloc"
# -fPIC: the archive goes into shared libraries (libgpumem_pinned_torch.so).
if ! CFLAGS="-O2 -g0 -fPIC" ./configure "${flags[@]}" >"$work/build.log" 2>&1 \
   || ! make -j"${GPUMEM_JOBS:-$(nproc)}" build_lib_static >>"$work/build.log" 2>&1; then
  tail -30 "$work/build.log" >&2
  fail "configuring or building jemalloc failed"
fi
grep -q '^#define JEMALLOC_TLS_MODEL *$' include/jemalloc/internal/jemalloc_internal_defs.h \
  || fail "the build still uses initial-exec TLS (JEMALLOC_TLS_MODEL is set)"

rm -rf "$dir"
mkdir -p "$dir/include/jemalloc" "$dir/lib"
cp include/jemalloc/jemalloc.h "$dir/include/jemalloc/"
cp lib/libjemalloc_pic.a "$dir/lib/"
{
  echo "jemalloc $(basename "$dsc" .dsc | sed 's/^jemalloc_//') (Debian source package), built $(date -u +%Y-%m-%d)"
  echo "configure ${flags[*]} CFLAGS='-O2 -g0 -fPIC'"
  echo "on $(. /etc/os-release && echo "$PRETTY_NAME"), $(cc --version | head -1)"
} >"$dir/SOURCE"
log "$dir: jemalloc.h, libjemalloc_pic.a ($(du -k "$dir/lib/libjemalloc_pic.a" | cut -f1) KiB)"
