# Sourced (not run) by the scripts that run SwiftPM. SwiftPM 6.3 leaves an empty
# TemporaryDirectory.XXXXXX (holding only .keep-directory) in $TMPDIR at each invocation, three to six
# a command: about ninety in /tmp after one scripts/test. The outermost script that sources this gives
# itself and everything it starts a TMPDIR of its own under the usual one, and removes it on exit, with
# whatever SwiftPM, the tests and pytest left there; scripts it starts find KEYCHAIND_SCRATCH_TMPDIR
# set and use the same folder. Mode 1777, like /tmp: tests that run as a throwaway uid (setpriv) and
# the package test's throwaway user make files there too. A script with an EXIT trap of its own calls
# scratch_tmpdir_remove from that trap.
scratch_tmpdir_remove() { :; }
if [ -z "${KEYCHAIND_SCRATCH_TMPDIR:-}" ]; then
  KEYCHAIND_SCRATCH_TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/kcd-tmp.XXXXXX")"
  chmod 1777 "$KEYCHAIND_SCRATCH_TMPDIR"
  export KEYCHAIND_SCRATCH_TMPDIR TMPDIR="$KEYCHAIND_SCRATCH_TMPDIR"
  scratch_tmpdir_remove() { rm -rf "$KEYCHAIND_SCRATCH_TMPDIR"; }
  trap scratch_tmpdir_remove EXIT
fi
