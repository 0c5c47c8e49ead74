package shim

import (
	"os"
	"testing"

	"github.com/hull-runtime/hull/internal/testenv"
)

// The package's tests leave no goroutine running and no descriptor open.
func TestMain(m *testing.M) { os.Exit(testenv.RunCheckingLeaks(m)) }
