// Command hull-agent is PID 1 of the Hull guest: it sets up the guest and
// serves the agent API to the host. Started with nsinit.Arg it is instead
// the helper that becomes a container process.
package main

import (
	"os"

	"github.com/hull-runtime/hull/internal/guest/agent"
	"github.com/hull-runtime/hull/internal/guest/nsinit"
)

func main() {
	if nsinit.IsHelper() {
		nsinit.Main()
	}
	os.Exit(agent.Main())
}
