package runtime

// capabilities are the only capabilities a sandbox keeps (after dropping
// all), on every backend. They are what package managers, build tools and
// ordinary root-in-a-container workflows need: file ownership and
// permission changes (CHOWN, DAC_OVERRIDE, FOWNER, FSETID), signalling its
// own processes (KILL), switching users (SETUID, SETGID, SETPCAP: the agent
// runs commands as the lease's user; apt drops to _apt, su, setpriv) and
// binding ports below 1024 (NET_BIND_SERVICE). Compared with Docker's
// default set, NET_RAW (raw sockets: ARP/ICMP spoofing on the bridge),
// MKNOD, SYS_CHROOT, AUDIT_WRITE and SETFCAP are dropped.
var capabilities = [...]string{
	"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
	"SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE",
}

// Capabilities returns the capabilities a sandbox keeps, without the
// "CAP_" prefix (Docker's spelling), as a new slice each call: the policy
// is a constant of berth, not a variable an importer could change.
func Capabilities() []string {
	return append([]string(nil), capabilities[:]...)
}
