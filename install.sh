#!/bin/sh
# cc-lhc installer for Linux and macOS (x64 and arm64).
#
#   curl -fsSL https://github.com/OWNER/REPO/releases/download/cc-lhc-vX.Y.Z/install.sh | sh
#   sh install.sh --help
#
# Downloads the cc-lhc bundle for this machine, verifies its SHA-256 (refusing to install
# when it cannot), unpacks it next to the versions already installed and switches to it in
# one rename. cc-lhc's own state (~/.cc-lhc) is never touched.
#
# Everything happens inside main(), called on the very last line, so a download cut short
# defines a few functions and runs nothing.

set -u

# BEGIN CC_LHC_RELEASE (filled in by build/release.py when a release is published)
RELEASE_VERSION=""
RELEASE_REPO=""
RELEASE_SUMS=""
# END CC_LHC_RELEASE

# Oldest glibc the Linux bundles are built against (manylinux_2_28 / AlmaLinux 8).
GLIBC_MIN_MAJOR=2
GLIBC_MIN_MINOR=28

usage() {
    cat <<EOF
Install or upgrade cc-lhc.

Usage: install.sh [--version X.Y.Z] [--quiet] [--help]

  --version X.Y.Z  install this release (default: ${RELEASE_VERSION:-the one named by CC_LHC_VERSION})
  -q, --quiet      print only warnings and errors
  -h, --help       show this help

Environment:
  CC_LHC_INSTALL_DIR    where versions live (default ~/.local/share/cc-lhc)
  CC_LHC_BIN_DIR        where the cc-lhc command is linked (default ~/.local/bin)
  CC_LHC_VERSION        same as --version
  CC_LHC_DOWNLOAD_BASE  URL of the folder holding the release assets (mirrors, tests)
  CC_LHC_REPO           GitHub owner/name to download from (default: ${RELEASE_REPO:-none})
  CC_LHC_DOWNLOAD_STALL_SECONDS
                        give a download up after this many seconds without data (default 60)

The bundle's SHA-256 must match the release's SHA256SUMS and, in a published installer,
the checksums embedded in this script; otherwise nothing is installed. A SHA-256 tool
(sha256sum, shasum or openssl) is required.

Re-running upgrades in place. The version you upgraded from is kept for a rollback;
sessions already running keep their version until they exit, and older versions are
removed on a later run once nothing runs from them.
Uninstall: rm -rf ~/.local/share/cc-lhc ~/.local/bin/cc-lhc (cc-lhc's records in
~/.cc-lhc are yours to keep or remove).
EOF
}

say() {
    if [ "$QUIET" != 1 ]; then
        printf 'cc-lhc install: %s\n' "$*" >&2
    fi
}

warn() {
    printf 'cc-lhc install: warning: %s\n' "$*" >&2
}

err() {
    printf 'cc-lhc install: error: %s\n' "$*" >&2
    exit 1
}

check_cmd() {
    command -v "$1" >/dev/null 2>&1
}

need_cmd() {
    if ! check_cmd "$1"; then
        err "this installer needs '$1', which was not found"
    fi
}

ensure() {
    if ! "$@"; then
        err "command failed: $*"
    fi
}

cleanup() {
    if [ -n "$STAGING" ]; then
        rm -rf "$STAGING"
    fi
    if [ -n "$TMP_DIR" ]; then
        rm -rf "$TMP_DIR"
    fi
    if [ -n "$LOCK_DIR" ]; then
        rm -rf "$LOCK_DIR"
    fi
}

# -- where are we -------------------------------------------------------------

detect_os() {
    _os=$(uname -s) || err "uname failed"
    case "$_os" in
        Linux) TARGET_OS=linux ;;
        Darwin) TARGET_OS=macos ;;
        MINGW* | MSYS* | CYGWIN* | Windows_NT)
            err "on Windows, use install.ps1 from PowerShell instead" ;;
        *) err "unsupported operating system: $_os (cc-lhc supports Linux, macOS and Windows)" ;;
    esac
}

detect_arch() {
    _arch=$(uname -m) || err "uname failed"
    case "$_arch" in
        x86_64 | amd64) TARGET_ARCH=x64 ;;
        aarch64 | arm64 | armv8*) TARGET_ARCH=arm64 ;;
        *) err "unsupported CPU architecture: $_arch (cc-lhc supports x64 and arm64)" ;;
    esac
    # A shell running under Rosetta 2 reports x86_64 on Apple silicon; the native
    # arm64 bundle is the right one there.
    if [ "$TARGET_OS" = macos ] && [ "$TARGET_ARCH" = x64 ]; then
        if [ "$(sysctl -n hw.optional.arm64 2>/dev/null)" = 1 ]; then
            say "Apple silicon under Rosetta: installing the native arm64 build"
            TARGET_ARCH=arm64
        fi
    fi
}

# The Linux bundles carry their own Python but link against the system's glibc.
check_libc() {
    [ "$TARGET_OS" = linux ] || return 0
    if _glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null); then
        _ver=${_glibc##* }
        _major=${_ver%%.*}
        _minor=${_ver#*.}
        _minor=${_minor%%.*}
        case "$_major$_minor" in
            '' | *[!0-9]*) return 0 ;;
        esac
        if [ "$_major" -lt "$GLIBC_MIN_MAJOR" ] ||
            { [ "$_major" -eq "$GLIBC_MIN_MAJOR" ] && [ "$_minor" -lt "$GLIBC_MIN_MINOR" ]; }; then
            err "this system's glibc $_ver is older than $GLIBC_MIN_MAJOR.$GLIBC_MIN_MINOR, which the cc-lhc bundles need; use the zipapp (cc-lhc.pyz) with Python 3.10+ instead"
        fi
        return 0
    fi
    _musl=""
    for _f in /lib/ld-musl-*; do
        [ -e "$_f" ] && _musl=1
    done
    if [ -z "$_musl" ] && (ldd --version 2>&1 || true) | grep -qi musl; then
        _musl=1
    fi
    if [ -n "$_musl" ]; then
        err "musl libc (e.g. Alpine) is not supported by the cc-lhc bundles, which need glibc; use the zipapp (cc-lhc.pyz) with Python 3.10+ instead"
    fi
    warn "could not tell which C library this system uses; trying anyway"
}

# -- tools ----------------------------------------------------------------------

pick_downloader() {
    if check_cmd curl; then
        DOWNLOADER=curl
    elif check_cmd wget; then
        DOWNLOADER=wget
    else
        err "this installer needs curl or wget to download cc-lhc"
    fi
}

pick_hasher() {
    if check_cmd sha256sum; then
        HASHER=sha256sum
    elif check_cmd shasum; then
        HASHER=shasum
    elif check_cmd openssl; then
        HASHER=openssl
    else
        err "no SHA-256 tool found (sha256sum, shasum or openssl); refusing to install an unverified download"
    fi
}

download() {
    # A server that accepts the connection and then sends nothing (or stops half-way)
    # is given up after STALL seconds without data, never waited for forever.
    # Only an https:// source is held to https all the way (no redirect to http).
    case "$1" in
        https://*)
            if [ "$DOWNLOADER" = curl ]; then
                curl --fail --silent --show-error --location --proto '=https' --tlsv1.2 \
                    --connect-timeout "$STALL" --speed-limit 1 --speed-time "$STALL" \
                    --retry 2 --output "$2" "$1"
            else
                wget --quiet --https-only --tries=2 -T "$STALL" --output-document="$2" "$1"
            fi
            ;;
        *)
            if [ "$DOWNLOADER" = curl ]; then
                curl --fail --silent --show-error --location \
                    --connect-timeout "$STALL" --speed-limit 1 --speed-time "$STALL" --output "$2" "$1"
            else
                wget --quiet --tries=1 -T "$STALL" --output-document="$2" "$1"
            fi
            ;;
    esac
}

sha256_of() {
    case "$HASHER" in
        sha256sum) _out=$(sha256sum "$1") ;;
        shasum) _out=$(shasum -a 256 "$1") ;;
        *) _out=$(openssl dgst -sha256 "$1") ;;
    esac || return 1
    case "$_out" in
        *'= '*) _out=${_out##*= } ;;  # openssl: "SHA2-256(file)= <hex>"
        *) _out=${_out%%[ 	]*} ;;
    esac
    _out=$(printf '%s' "$_out" | tr 'ABCDEF' 'abcdef')
    case "$_out" in
        *[!0-9a-f]*) return 1 ;;
    esac
    [ "${#_out}" -eq 64 ] || return 1
    printf '%s\n' "$_out"
}

# Print the sum listed for file name $1 in sha256sum-format text on stdin. Status 1 when
# none is listed, 2 when the name is listed more than once: which line would be the
# real one is then anyone's guess, so no sum is printed.
sum_for() {
    _found=""
    while IFS= read -r _line || [ -n "$_line" ]; do
        _hash=${_line%% *}
        _name=${_line#* }
        _name=${_name# }
        _name=${_name#\*}
        if [ "$_name" = "$1" ] && [ "$_hash" != "$_line" ]; then
            [ -z "$_found" ] || return 2
            _found=$(printf '%s' "$_hash" | tr 'ABCDEF' 'abcdef')
        fi
    done
    [ -n "$_found" ] || return 1
    printf '%s\n' "$_found"
}

# True when symlink $1, resolved, stays inside the folder whose physical path is $2.
link_stays_inside() {
    _t=$(readlink "$1") || return 1
    case "$_t" in
        '' | /*) return 1 ;;
    esac
    _d=${1%/*}
    if [ -d "$_d/$_t" ]; then
        _r=$(cd "$_d/$_t" 2>/dev/null && pwd -P) || return 1
    else
        case "$_t" in
            */*) _r=$(cd "$_d/${_t%/*}" 2>/dev/null && pwd -P) || return 1 ;;
            *) _r=$(cd "$_d" 2>/dev/null && pwd -P) || return 1 ;;
        esac
    fi
    case "$_r/" in
        "$2"/*) return 0 ;;
    esac
    return 1
}

# Walk folder $1 (each level in a subshell, so the walk's variables stay its own) and
# print the first symlink that leads outside the folder whose physical path is $2.
escaping_link() (
    for _e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        if [ -L "$_e" ]; then
            if ! link_stays_inside "$_e" "$2"; then
                printf '%s\n' "$_e"
                return 0
            fi
        elif [ -d "$_e" ]; then
            _found=$(escaping_link "$_e" "$2") || return 1
            if [ -n "$_found" ]; then
                printf '%s\n' "$_found"
                return 0
            fi
        fi
    done
    return 0
)

# -- versions on disk -----------------------------------------------------------

# Rename symlink $1 onto symlink $2 in one step. Plain `mv` would move $1 *into* the
# directory $2 points at, so ask for no-dereference: -T (GNU) or -h (BSD/macOS).
replace_link() {
    if [ ! -e "$2" ] && [ ! -L "$2" ]; then
        mv "$1" "$2" && return 0
    fi
    mv -T "$1" "$2" 2>/dev/null && return 0
    mv -h "$1" "$2" 2>/dev/null && return 0
    rm -f "$1"
    return 1
}

# Print the physical paths of version folders some process is running from, one per
# line; fail when this system gives no reliable way to tell.
running_version_dirs() {
    _versions=$(cd "$INSTALL_DIR/versions" && pwd -P) || return 1
    if [ -r /proc/self/exe ] && check_cmd readlink; then
        for _exe in /proc/[0-9]*/exe; do
            _target=$(readlink "$_exe" 2>/dev/null) || continue
            case "$_target" in
                "$_versions"/*)
                    _rest=${_target#"$_versions"/}
                    printf '%s\n' "${_rest%%/*}"
                    ;;
            esac
        done
        return 0
    fi
    if [ "$TARGET_OS" = macos ] && check_cmd lsof; then
        _txt=$(lsof -nP -w -Fn -d txt 2>/dev/null) || return 1
        printf '%s\n' "$_txt" | while IFS= read -r _l; do
            case "$_l" in
                "n$_versions"/*)
                    _rest=${_l#"n$_versions"/}
                    printf '%s\n' "${_rest%%/*}"
                    ;;
            esac
        done
        return 0
    fi
    return 1
}

# Remove version folders other than the current one ($1) and the previous one ($2),
# skipping any that a running cc-lhc still uses.
# The first file (or link) of the fresh copy $1 that the installed copy $2 lacks or
# holds otherwise, as a path inside the bundle; nothing when $2 holds all of $1 as it is.
# (Files are compared by their SHA-256, with the hash tool the download was checked with.)
first_difference() (
    for _e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        [ -e "$_e" ] || [ -L "$_e" ] || continue
        _there="$2/${_e##*/}"
        if [ -L "$_e" ]; then
            if [ -L "$_there" ] && [ "$(readlink "$_e")" = "$(readlink "$_there")" ]; then
                continue
            fi
        elif [ -d "$_e" ]; then
            if [ -d "$_there" ] && [ ! -L "$_there" ]; then
                _found=$(first_difference "$_e" "$_there") || return 1
                [ -n "$_found" ] || continue
                printf '%s\n' "${_e##*/}/$_found"
                return 0
            fi
        elif [ -f "$_there" ] && [ ! -L "$_there" ] && { [ ! -x "$_e" ] || [ -x "$_there" ]; }; then
            _mine=$(sha256_of "$_e") && _theirs=$(sha256_of "$_there") || return 1
            [ "$_mine" != "$_theirs" ] || continue
        fi
        printf '%s\n' "${_e##*/}"
        return 0
    done
    return 0
)

# Whether version $1 comes before version $2 (dotted numbers, compared part by part; a
# part that is not a number compares as 0).
older_version() (
    _a="$1." _b="$2."
    while [ -n "$_a" ] || [ -n "$_b" ]; do
        _x=${_a%%.*} _y=${_b%%.*}
        _a=${_a#*.} _b=${_b#*.}
        case "$_x" in ''|*[!0-9]*) _x=0 ;; esac
        case "$_y" in ''|*[!0-9]*) _y=0 ;; esac
        [ "$_x" -lt "$_y" ] && return 0
        [ "$_x" -gt "$_y" ] && return 1
    done
    return 1
)

prune_versions() {
    if [ -z "$2" ] && [ "$3" = unknown ]; then
        say "keeping the old versions: which one you upgraded from is not recorded here yet"
        return 0
    fi
    if ! _busy=$(running_version_dirs); then
        say "cannot tell which versions are in use here; keeping the old ones"
        return 0
    fi
    # (sh has no local variables: these names are this function's own, not main's)
    for _old_dir in "$INSTALL_DIR"/versions/*; do
        [ -d "$_old_dir" ] || continue
        _old=${_old_dir##*/}
        if [ "$_old" = "$1" ] || [ "$_old" = "$2" ]; then
            continue
        fi
        if printf '%s\n' "$_busy" | grep -Fqx -- "$_old"; then
            say "keeping $_old: a running cc-lhc still uses it"
            continue
        fi
        rm -rf "$_old_dir" && say "removed old version $_old"
    done
}

# The version that was current before the last change of version, from
# $INSTALL_DIR/previous (empty when none is recorded).
read_previous() {
    _prev=""
    if [ -f "$INSTALL_DIR/previous" ]; then
        IFS= read -r _prev <"$INSTALL_DIR/previous" || true
    fi
    case "$_prev" in
        '' | . | .. | .* | */*) _prev="" ;;
    esac
    printf '%s\n' "$_prev"
}

# Record $1 as the version to roll back to, in one rename.
write_previous() {
    printf '%s\n' "$1" >"$INSTALL_DIR/.previous.new" &&
        mv -f "$INSTALL_DIR/.previous.new" "$INSTALL_DIR/previous"
}

# True when symlink $1 points into the install folder (made by this installer).
link_is_ours() {
    _t=$(readlink "$1" 2>/dev/null) || return 1
    [ -n "$_t" ] || return 1
    _t=$(printf '%s\n' "$_t" | tr -s /)
    case "$_t" in
        */../* | */.. | ../* | ..) ;;
        "$INSTALL_DIR"/*) return 0 ;;
    esac
    case "$_t" in
        /*) ;;
        *) _t="${1%/*}/$_t" ;;
    esac
    [ -d "$INSTALL_DIR" ] || return 1
    _tdir=$(cd "${_t%/*}" 2>/dev/null && pwd -P) || return 1
    _idir=$(cd "$INSTALL_DIR" 2>/dev/null && pwd -P) || return 1
    case "$_tdir/" in
        "$_idir"/*) return 0 ;;
    esac
    return 1
}

# Refuse to replace a cc-lhc command that another install put at $BIN_DIR/cc-lhc.
check_command_path() {
    _cmd="$BIN_DIR/cc-lhc"
    if [ -L "$_cmd" ]; then
        link_is_ours "$_cmd" && return 0
        _to=$(readlink "$_cmd" 2>/dev/null || true)
        err "$_cmd is a link to $_to, which is not part of this installation ($INSTALL_DIR): another cc-lhc (from npm, pip or another install folder?) seems to be there, and cc-lhc was not installed. Remove that link (rm \"$_cmd\") to replace it with this one, or set CC_LHC_BIN_DIR to put this installer's command in another folder"
    fi
    if [ -e "$_cmd" ]; then
        err "$_cmd exists and was not made by this installer, so cc-lhc was not installed; remove it or set CC_LHC_BIN_DIR"
    fi
    return 0
}

# When process $1 started, as the system tells it (empty when it cannot): with its pid,
# it names one process, not whichever later one the pid was given to.
started_at() {
    if [ -r "/proc/$1/stat" ]; then
        # (the fields after the command's name, which is in parentheses and may hold spaces)
        sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
    else
        ps -o lstart= -p "$1" 2>/dev/null || true
    fi
}

write_lock_owner() {
    { echo "$$"; started_at "$$"; } >"$LOCK_DIR/pid"
}

take_lock() {
    LOCK_DIR="$INSTALL_DIR/.install-lock"
    if mkdir "$LOCK_DIR" 2>/dev/null; then
        write_lock_owner
        return 0
    fi
    if [ ! -d "$LOCK_DIR" ]; then
        LOCK_DIR=""  # (not ours: cleanup must never remove a lock another installer took meanwhile)
        err "cannot write in $INSTALL_DIR (read-only, or not yours?): set CC_LHC_INSTALL_DIR to a folder you can write; nothing was changed"
    fi
    _holder="" _since=""
    { IFS= read -r _holder && IFS= read -r _since; } 2>/dev/null <"$LOCK_DIR/pid" || true
    case "$_holder" in
        '' | *[!0-9]*) _holder="" ;;
    esac
    # Held while its installer runs: a pid alive now that started when the lock's owner did
    # (an owner killed long ago leaves its pid to whatever process gets it next).
    if [ -n "$_holder" ] && kill -0 "$_holder" 2>/dev/null &&
        { [ -z "$_since" ] || [ "$(started_at "$_holder")" = "$_since" ]; }; then
        _lock=$LOCK_DIR
        LOCK_DIR=""
        err "another cc-lhc install (pid $_holder) is running; try again when it finishes (if none is, remove $_lock)"
    fi
    # The holder is gone: the lock is stale.
    rm -rf "$LOCK_DIR"
    mkdir "$LOCK_DIR" 2>/dev/null || { LOCK_DIR=""; err "cannot write in $INSTALL_DIR (read-only, or not yours?): set CC_LHC_INSTALL_DIR to a folder you can write; nothing was changed"; }
    write_lock_owner
}

# Whether $1 (a folder) is an entry of PATH, however the entry is spelled: with a
# trailing slash, or through a link to the same folder.
on_path() {
    _rest="${PATH:-}:"
    while [ -n "$_rest" ]; do
        _entry=${_rest%%:*}
        _rest=${_rest#*:}
        [ -n "$_entry" ] && [ -d "$_entry" ] || continue
        if [ "$(cd "$_entry" 2>/dev/null && pwd -P)" = "$(cd "$1" 2>/dev/null && pwd -P)" ]; then
            return 0
        fi
    done
    return 1
}

# $1 written for the inside of a shell's double quotes ($2: the characters to escape).
dquoted() {
    printf '%s' "$1" | sed "s/[$2]/\\\\&/g"
}

# $1 as one single-quoted shell word, whatever it holds.
squoted() {
    printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"
}

path_hint() {
    case ":${PATH:-}:" in
        *":$BIN_DIR:"*) _on=yes ;;
        *) if on_path "$BIN_DIR"; then _on=yes; else _on=no; fi ;;
    esac
    case "$_on" in
        yes)
            _found=$(command -v cc-lhc 2>/dev/null || true)
            if [ -n "$_found" ] && [ "$(cd "${_found%/*}" 2>/dev/null && pwd -P)" != "$(cd "$BIN_DIR" && pwd -P)" ]; then
                warn "another cc-lhc ($_found) comes before $BIN_DIR on your PATH"
            fi
            return 0
            ;;
    esac
    # (pasted as printed, whatever the folder's name holds: a quote, a $, a backslash)
    _export="export PATH=\"$(dquoted "$BIN_DIR" '\\"$`'):\$PATH\""
    case "${SHELL:-}" in
        */fish) _how="fish_add_path \"$(dquoted "$BIN_DIR" '\\"$')\"" ;;
        */zsh) _how="echo $(squoted "$_export") >> ~/.zshrc" ;;
        */bash)
            # (an interactive bash reads ~/.bashrc, a login one ~/.bash_profile or else ~/.profile:
            # a new terminal on macOS, a tmux window, an ssh session)
            _login=.profile
            [ -f "$HOME/.bash_profile" ] && _login=.bash_profile
            _how="echo $(squoted "$_export") >> ~/.bashrc
    echo $(squoted "$_export") >> ~/$_login" ;;
        *) _how="echo $(squoted "$_export") >> ~/.profile" ;;
    esac
    # (typed at a prompt: single quotes, where an interactive bash or zsh expands no `!`)
    warn "$BIN_DIR is not on your PATH. To add it, run:
    $_how
then open a new terminal (or run: export PATH=$(squoted "$BIN_DIR"):\"\$PATH\")."
}

# " (the disk holding $1 is full)" when it has no room left, else nothing: said with the
# failure a full disk makes (a download cut short, an unpack that stopped). $2 (any word):
# $1 is the download folder, which TMPDIR moves.
full_hint() {
    _avail=$(df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print $4 }')
    case "$_avail" in
        '' | *[!0-9]*) return 0 ;;
    esac
    if [ "$_avail" -lt 1024 ]; then
        printf ' (the disk holding %s is full%s)' "$1" "${2:+; TMPDIR names another folder to download into}"
    fi
}

# -- main -------------------------------------------------------------------------

main() {
    QUIET=0
    STAGING=""
    TMP_DIR=""
    LOCK_DIR=""
    _want_version=${CC_LHC_VERSION:-}

    while [ $# -gt 0 ]; do
        case "$1" in
            -h | --help) usage; return 0 ;;
            -q | --quiet) QUIET=1 ;;
            --version)
                [ $# -ge 2 ] || err "--version needs a value, e.g. --version 0.1.0"
                _want_version=$2
                shift
                ;;
            --version=*) _want_version=${1#--version=} ;;
            *) err "unknown argument: $1 (see --help)" ;;
        esac
        shift
    done
    _want_version=${_want_version#cc-lhc-}
    _want_version=${_want_version#v}
    case "$_want_version" in
        *[!0-9A-Za-z.+-]*) err "not a version: $_want_version" ;;
    esac

    [ -n "${HOME:-}" ] || err "HOME is not set"
    INSTALL_DIR=${CC_LHC_INSTALL_DIR:-$HOME/.local/share/cc-lhc}
    BIN_DIR=${CC_LHC_BIN_DIR:-$HOME/.local/bin}
    # (one spelling of each: a HOME ending in / made .../home//.local, which the command's
    # link, written from the folder's own spelling, did not start with)
    INSTALL_DIR=$(printf '%s\n' "$INSTALL_DIR" | tr -s /)
    BIN_DIR=$(printf '%s\n' "$BIN_DIR" | tr -s /)
    INSTALL_DIR=${INSTALL_DIR%/}
    BIN_DIR=${BIN_DIR%/}
    STALL=${CC_LHC_DOWNLOAD_STALL_SECONDS:-60}
    case "$STALL" in
        '' | *[!0-9]* | 0) err "CC_LHC_DOWNLOAD_STALL_SECONDS must be a whole number of seconds above 0" ;;
    esac

    need_cmd uname
    need_cmd mkdir
    need_cmd mktemp
    need_cmd mv
    need_cmd ln
    need_cmd rm
    need_cmd tar
    need_cmd tr
    need_cmd grep
    detect_os
    detect_arch
    check_libc
    pick_downloader
    pick_hasher

    _repo=${CC_LHC_REPO:-$RELEASE_REPO}
    _version=${_want_version:-$RELEASE_VERSION}
    if [ -n "${CC_LHC_DOWNLOAD_BASE:-}" ]; then
        _base=${CC_LHC_DOWNLOAD_BASE%/}
    elif [ -z "$_version" ]; then
        err "which version? Pass --version X.Y.Z (this copy of install.sh names none)"
    elif [ -z "$_repo" ]; then
        err "this copy of install.sh names no GitHub repository: set CC_LHC_REPO=owner/name or CC_LHC_DOWNLOAD_BASE"
    else
        _base="https://github.com/$_repo/releases/download/cc-lhc-v$_version"
    fi

    # Before anything is downloaded or changed.
    check_command_path

    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    TMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cc-lhc-install.XXXXXX") || err "cannot create a temporary folder"

    say "fetching checksums from $_base/"
    download "$_base/SHA256SUMS" "$TMP_DIR/SHA256SUMS" || err "could not download $_base/SHA256SUMS"

    if [ -z "$_version" ]; then
        _version=$(sed -n "s/^[0-9a-fA-F]\{64\}  *\*\{0,1\}cc-lhc-\(.*\)-$TARGET_OS-$TARGET_ARCH\.tar\.gz\$/\1/p" \
            "$TMP_DIR/SHA256SUMS")
        case "$_version" in
            '') if grep -q 'cc-lhc-.*\.tar\.gz' "$TMP_DIR/SHA256SUMS"; then
                    err "$_base/ holds no cc-lhc for $TARGET_OS-$TARGET_ARCH (its SHA256SUMS lists builds for other systems only)"
                fi
                err "cannot tell which version $_base/ holds (its SHA256SUMS lists no cc-lhc bundle); pass --version X.Y.Z" ;;
            *"
"*) err "$_base/ holds several versions of cc-lhc; pass --version X.Y.Z" ;;
        esac
    fi

    _asset="cc-lhc-$_version-$TARGET_OS-$TARGET_ARCH.tar.gz"
    _want=$(sum_for "$_asset" <"$TMP_DIR/SHA256SUMS")
    case $? in
        0) ;;
        2) err "the release's SHA256SUMS lists $_asset more than once; refusing to install (nothing was changed)" ;;
        *) err "the release's SHA256SUMS lists no $_asset (is there a $TARGET_OS-$TARGET_ARCH build of $_version?)" ;;
    esac

    # A published installer carries its release's checksums, so a mirror that swaps
    # both the bundle and SHA256SUMS is still caught.
    if [ -n "$RELEASE_SUMS" ] && [ "$_version" = "$RELEASE_VERSION" ]; then
        _embedded=$(printf '%s\n' "$RELEASE_SUMS" | sum_for "$_asset")
        case $? in
            0) ;;
            2) err "this installer's embedded checksums list $_asset more than once; refusing to install" ;;
            *) err "this installer's embedded checksums list no $_asset" ;;
        esac
        if [ "$_embedded" != "$_want" ]; then
            err "the downloaded SHA256SUMS does not match the checksums embedded in this installer for $_asset
  want (embedded) $_embedded
  got  (download) $_want
refusing to install"
        fi
    elif [ -n "$RELEASE_SUMS" ]; then
        say "this installer embeds checksums for $RELEASE_VERSION only; verifying $_version against its release's SHA256SUMS"
    fi

    say "downloading $_asset"
    download "$_base/$_asset" "$TMP_DIR/$_asset" ||
        err "could not download $_base/$_asset$(full_hint "$TMP_DIR" tmp)"
    _got=$(sha256_of "$TMP_DIR/$_asset") || err "could not compute the SHA-256 of $_asset with $HASHER"
    if [ "$_got" != "$_want" ]; then
        err "checksum mismatch for $_asset
  want $_want
  got  $_got
refusing to install (nothing was changed)"
    fi
    say "verified sha256 $_got"

    mkdir -p "$INSTALL_DIR/versions" 2>/dev/null ||
        err "cannot make $INSTALL_DIR/versions (read-only, or not yours?): set CC_LHC_INSTALL_DIR to a folder you can write; nothing was changed"
    INSTALL_DIR=$(cd "$INSTALL_DIR" && pwd) || err "cannot use $INSTALL_DIR"
    take_lock
    # Leftovers of interrupted runs (we hold the lock, so none is live).
    rm -rf "$INSTALL_DIR"/versions/.staging.*

    _id=$(printf '%s' "$_got" | cut -c1-12)
    _name="$_version-$_id"
    _dest="$INSTALL_DIR/versions/$_name"
    STAGING=$(mktemp -d "$INSTALL_DIR/versions/.staging.XXXXXX") || err "cannot create a staging folder in $INSTALL_DIR/versions"
    if ! (cd "$STAGING" && tar -xzf "$TMP_DIR/$_asset" 2>"$TMP_DIR/tar.err"); then
        err "could not unpack $_asset into $INSTALL_DIR/versions ($(tail -n 1 "$TMP_DIR/tar.err"))$(full_hint "$INSTALL_DIR"); nothing was changed"
    fi
    _top="$STAGING/cc-lhc-$_version-$TARGET_OS-$TARGET_ARCH"
    [ ! -L "$_top" ] || err "$_asset holds its folder as a symbolic link; refusing to install (nothing was changed)"
    [ -f "$_top/cc-lhc" ] || err "$_asset does not contain cc-lhc-$_version-$TARGET_OS-$TARGET_ARCH/cc-lhc"
    if [ ! -x "$_top/cc-lhc" ]; then
        # (its mode says it runs, yet it may not: the filesystem forbids running programs)
        [ -n "$(find "$_top/cc-lhc" -perm -100 2>/dev/null)" ] ||
            err "$_asset holds cc-lhc-$_version-$TARGET_OS-$TARGET_ARCH/cc-lhc as a file that is not executable; refusing to install (nothing was changed)"
        err "programs cannot run from $INSTALL_DIR (its filesystem is mounted noexec?): set CC_LHC_INSTALL_DIR to a folder elsewhere; nothing was changed"
    fi
    # Verified is not the same as harmless: a link in the bundle that leads out of
    # its own folder would make the installed version use files it does not carry.
    _real_top=$(cd "$_top" && pwd -P) || err "cannot use $_top"
    _escape=$(escaping_link "$_top" "$_real_top") || err "could not check the links in $_asset"
    if [ -n "$_escape" ]; then
        err "$_asset contains a symbolic link that leads outside its own folder (${_escape#"$STAGING"/} -> $(readlink "$_escape")); refusing to install (nothing was changed)"
    fi
    _damaged=""
    if [ -f "$_dest/.cc-lhc-complete" ] && [ -x "$_dest/cc-lhc" ]; then
        # The same version again: kept as it is (a running session may be using it) when
        # it still holds what the download holds; a damaged copy is replaced.
        _damaged=$(first_difference "$_top" "$_dest") || err "could not compare $_dest with $_asset"
        if [ -z "$_damaged" ]; then
            say "$_version is already unpacked in $_dest (it matches the download)"
            rm -rf "$STAGING"
        else
            say "the installed $_version differs from the download ($_damaged): unpacking it again"
        fi
    else
        _damaged=new
    fi
    if [ -n "$_damaged" ]; then
        # Try the new build before switching to it, with a throwaway state folder.
        if ! _check=$(CC_LHC_HOME="$TMP_DIR/state" "$_top/cc-lhc" --lhc-version 2>&1); then
            err "the downloaded cc-lhc does not run on this system; nothing was changed:
$_check"
        fi
        printf '%s\n' "$_got" >"$_top/.cc-lhc-complete" || err "cannot write to $_top"
        if [ -e "$_dest" ]; then
            # (moved aside before it goes: the new copy takes its place in one step)
            _aside="$STAGING/replaced"
            mv "$_dest" "$_aside" || err "could not move the damaged $_dest aside"
        fi
        mv "$_top" "$_dest" || err "could not move the new version into $_dest"
        rm -rf "$STAGING"
    fi

    mkdir -p "$BIN_DIR" 2>/dev/null ||
        err "cannot make $BIN_DIR (read-only, or not yours?): set CC_LHC_BIN_DIR to a folder you can write; $_version is unpacked in $_dest but nothing was switched to it"
    BIN_DIR=$(cd "$BIN_DIR" && pwd) || err "cannot use $BIN_DIR"
    _link="$BIN_DIR/cc-lhc"
    check_command_path  # again, before switching: it may have appeared meanwhile

    # `previous` names the version to roll back to. It changes only when the current
    # version does, so re-running the same version keeps it (and never prunes it).
    _was=""
    if [ -L "$INSTALL_DIR/current" ]; then
        _was=$(readlink "$INSTALL_DIR/current" 2>/dev/null || true)
        _was=${_was##*/}
    fi
    _previous=$(read_previous)
    _known=known
    if [ -n "$_was" ] && [ "$_was" != "$_name" ]; then
        # Recorded before the switch: a run cut short in between leaves `previous`
        # naming a version that is still kept, never a stale one.
        write_previous "$_was" || err "cannot write $INSTALL_DIR/previous"
        _previous=$_was
    elif [ -n "$_was" ] && [ ! -f "$INSTALL_DIR/previous" ]; then
        _known=unknown  # installed by an older installer that did not record it
    elif [ -z "$_was" ] && [ ! -f "$INSTALL_DIR/previous" ]; then
        write_previous "" || err "cannot write $INSTALL_DIR/previous"  # (a first install: none before it)
    fi
    if [ "$_previous" = "$_name" ]; then
        _previous=""
    fi
    if [ "$_was" != "$_name" ]; then
        rm -f "$INSTALL_DIR/.current.new"
        ln -s "versions/$_name" "$INSTALL_DIR/.current.new" || err "cannot create a link in $INSTALL_DIR"
        replace_link "$INSTALL_DIR/.current.new" "$INSTALL_DIR/current" ||
            err "could not switch $INSTALL_DIR/current to $_name"
    fi

    if [ "$(readlink "$_link" 2>/dev/null || true)" != "$INSTALL_DIR/current/cc-lhc" ]; then
        rm -f "$BIN_DIR/.cc-lhc.new"
        ln -s "$INSTALL_DIR/current/cc-lhc" "$BIN_DIR/.cc-lhc.new" || err "cannot create a link in $BIN_DIR"
        replace_link "$BIN_DIR/.cc-lhc.new" "$_link" || err "could not link $_link"
    fi

    prune_versions "$_name" "$_previous" "$_known"

    if [ -n "$_was" ] && [ "$_was" != "$_name" ]; then
        if [ "${_was%-*}" = "$_version" ]; then
            say "replaced $_version with another build of it; sessions already running keep theirs until they exit"
        elif older_version "$_version" "${_was%-*}"; then
            say "went back ${_was%-*} -> $_version; sessions already running keep their version until they exit"
        else
            say "upgraded ${_was%-*} -> $_version; sessions already running keep their version until they exit"
        fi
    fi
    if [ -n "$_previous" ] && [ -d "$INSTALL_DIR/versions/$_previous" ]; then
        say "kept ${_previous%-*} for a rollback: $INSTALL_DIR/versions/$_previous/cc-lhc"
    fi
    say "installed cc-lhc $_version in $_dest"
    say "$_link -> $INSTALL_DIR/current/cc-lhc"
    path_hint
    return 0
}

main "$@" || exit 1
