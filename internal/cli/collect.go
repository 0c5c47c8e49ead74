package cli

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// collectLogLines is how many lines of each log the report keeps.
const collectLogLines = 60

// secretLine matches configuration or log lines whose value may be a
// secret; the report keeps the key and drops the value.
var secretLine = regexp.MustCompile(`(?i)^(\s*[\w.-]*(password|passwd|secret|token|credential|private_key|apikey|api_key)[\w.-]*\s*[=:]\s*)(.+)$`)

// collectCmd is `hull collect`: one markdown report to paste into a bug
// report, made of what the other commands print plus recent logs.
func collectCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hull collect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rf stateRootFlags
	rf.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfgPath := &rf.config
	rootDir, err := rf.resolve()
	if err != nil {
		fmt.Fprintf(stderr, "hull collect: %v\n", err)
		return 1
	}
	root := &rootDir
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hull collect: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	host, _ := os.Hostname()
	fmt.Fprintf(stdout, "# Hull collect report\n\nhost `%s`, %s, hull %s (commit %s)\n", host, time.Now().UTC().Format(time.RFC3339), Version, Commit)

	envArgs := []string{"env"}
	if *cfgPath != "" {
		envArgs = append(envArgs, "--config", *cfgPath)
	}
	section(stdout, "Environment and configuration (`hull env`)", redact(runSelf(envArgs...)))
	section(stdout, "Host requirements (`hull check`)", runSelf(append([]string{"check"}, envArgs[1:]...)...))
	section(stdout, "Sandboxes (`hull ps`)", runSelf("ps", "--root", *root))
	section(stdout, "What `hull gc --dry-run` would remove", runSelf("gc", "--dry-run", "--root", *root))
	section(stdout, "Versions", versions())
	writeSandboxLogs(stdout, *root)
	section(stdout, "containerd and shim log (journal, lines naming hull)", redact(journal()))
	return 0
}

// runSelf runs another hull subcommand in this process and returns what
// it printed, with its exit status when that was not 0.
func runSelf(args ...string) string {
	var out bytes.Buffer
	code := Main(args, nil, &out, &out)
	if code != 0 {
		fmt.Fprintf(&out, "(exit status %d)\n", code)
	}
	return out.String()
}

func section(w io.Writer, title, body string) {
	fmt.Fprintf(w, "\n## %s\n\n```\n%s\n```\n", title, strings.TrimRight(body, "\n"))
}

// redact replaces the value of every line that looks like a secret.
func redact(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if m := secretLine.FindStringSubmatch(l); m != nil {
			lines[i] = m[1] + "<redacted>"
		}
	}
	return strings.Join(lines, "\n")
}

func versions() string {
	var b strings.Builder
	for _, c := range [][]string{
		{"uname", "-a"},
		{qemu.HullBinary, "--version"},
		{qemu.DistroBinary, "--version"},
		{"containerd", "--version"},
		{"runc", "--version"},
	} {
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		line := strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
		if err != nil && line == "" {
			line = "not found"
		}
		fmt.Fprintf(&b, "%-20s %s\n", c[0]+":", line)
	}
	return b.String()
}

// writeSandboxLogs writes the tail of each sandbox's guest console (the
// agent logs there) and QEMU log.
func writeSandboxLogs(w io.Writer, root string) {
	dirs, _ := os.ReadDir(root)
	var names []string
	for _, d := range dirs {
		if d.IsDir() && !strings.HasPrefix(d.Name(), ".") {
			names = append(names, d.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		section(w, "Guest console and QEMU logs", "no sandbox directories under "+root)
		return
	}
	for _, n := range names {
		for _, f := range []string{"console.log", "qemu.log"} {
			p := filepath.Join(root, n, f)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			section(w, fmt.Sprintf("%s of sandbox %s (last %d lines)", f, n, collectLogLines), redact(tailFile(p, collectLogLines)))
		}
	}
}

func tailFile(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// journal returns recent containerd journal lines that concern Hull.
func journal() string {
	if _, err := exec.LookPath("journalctl"); err != nil {
		return "journalctl not found: see containerd's own log for lines with sandbox= and container= keys"
	}
	out, err := exec.Command("journalctl", "-u", "containerd", "--no-pager", "-n", "2000", "-o", "short-iso").Output()
	if err != nil {
		return fmt.Sprintf("journalctl -u containerd: %v", err)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "hull") {
			keep = append(keep, l)
		}
	}
	if len(keep) > collectLogLines*2 {
		keep = keep[len(keep)-collectLogLines*2:]
	}
	if len(keep) == 0 {
		return "no containerd journal lines mention hull"
	}
	return strings.Join(keep, "\n")
}
