package testenv

import (
	"os"
	"strings"
)

// ContainerdAddressEnv names the containerd socket the tests use instead
// of the usual places.
const ContainerdAddressEnv = "BERTH_CONTAINERD_ADDRESS"

// ContainerdSocket returns the containerd socket to test against:
// $BERTH_CONTAINERD_ADDRESS (a path, "unix://" allowed) when set, else the
// first of defaults (the usual sockets) that is a socket; "" when there is
// none.
func ContainerdSocket(defaults ...string) string {
	paths := defaults
	if env := os.Getenv(ContainerdAddressEnv); env != "" {
		paths = []string{strings.TrimPrefix(env, "unix://")}
	}
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
			return p
		}
	}
	return ""
}
