package sandbox

import (
	"os"
	"testing"

	"github.com/hull-runtime/hull/internal/testenv"
)

// The package's tests leave no goroutine running and no descriptor open;
// QEMU's spawner thread lives as long as the process (spawn.go).
func TestMain(m *testing.M) { os.Exit(testenv.RunCheckingLeaks(m, "internal/vm/qemu.spawner")) }
