// Command etcd is etcd's own server entry point (go.etcd.io/etcd/server/v3
// etcdmain), built at the version pinned in go.mod for the test cluster.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
