#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release) in build/<preset>.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"

# A release build is what Debian's python3 imports: a .pth file in its
# site-packages for local installs (not dpkg's /usr/lib/python3) names
# build/release/python, so `import stoker` works from any folder and always
# sees the latest build. Without write access there, the user's site-packages.
if [[ $preset == release && -x /usr/bin/python3 && -d build/release/python/stoker ]]; then
  site=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  if ! mkdir -p "$site" 2>/dev/null || [[ ! -w $site ]]; then
    site=$(/usr/bin/python3 -m site --user-site)
    mkdir -p "$site"
  fi
  echo "$PWD/build/release/python" >"$site/stoker.pth"
fi
