// Command coredns is the test cluster's DNS server: CoreDNS with only the plugins its
// Corefile uses (the kubernetes plugin for cluster.local, a template answering NXDOMAIN
// for every outside name: the cluster has no way out, so nothing is forwarded). Its own
// module, because CoreDNS pins a newer client-go than the Kubernetes 1.34 binaries.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

func init() {
	// The plugin order of a server block (CoreDNS' plugin.cfg order, for these plugins).
	dnsserver.Directives = []string{
		"ready", "health", "errors", "loadbalance", "cache", "template", "kubernetes",
	}
}

func main() { coremain.Run() }
