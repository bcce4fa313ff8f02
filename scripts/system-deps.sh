#!/usr/bin/env bash
# The Debian packages some tests need: sshd (a real OpenSSH server on loopback), tmux (the TUI in a
# real terminal), capsh (py-spy without CAP_SYS_PTRACE), slurmctld/slurmd/munged (a real two-node
# SLURM cluster on loopback). Installs the missing ones where it can (root with apt-get); elsewhere
# it prints the one command that would, and the tests that need them skip, saying why.
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v capsh >/dev/null 2>&1 || [ -x /sbin/capsh ] || need+=(libcap2-bin)
for daemon in slurmctld slurmd; do
  command -v "$daemon" >/dev/null 2>&1 || [ -x "/usr/sbin/$daemon" ] || { need+=(slurm-wlm); break; }
done
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing ${need[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "== missing ${need[*]}: the tests that need them will skip. To run them:"
  echo "   sudo apt-get install -y ${need[*]}"
fi
