package nsinit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func init() {
	if IsHelper() {
		// Exec mode unshares CLONE_FS and joins the mount namespace on
		// this thread; everything after must run on it, up to execve.
		runtime.LockOSThread()
	}
}

// IsHelper reports whether this process was started as the helper.
func IsHelper() bool {
	return len(os.Args) > 1 && os.Args[1] == Arg
}

// Main runs the helper and never returns.
func Main() {
	sync := os.NewFile(SyncFD, "sync")
	unix.CloseOnExec(SyncFD)
	err := run()
	var f *ExecFailure
	msg := Message{Type: MsgError, Reason: fmt.Sprint(err)}
	code := 1
	if errors.As(err, &f) {
		msg = Message{Type: MsgError, Code: f.Code, Path: f.Path, Reason: f.Reason}
		code = int(f.Code)
	}
	sync.Write(msg.Marshal())
	os.Exit(code)
}

func run() error {
	cfgFile := os.NewFile(ConfigFD, "config")
	var cfg Config
	err := json.NewDecoder(cfgFile).Decode(&cfg)
	cfgFile.Close()
	if err != nil {
		return fmt.Errorf("reading helper config: %w", err)
	}
	if err := prepareProcess(&cfg); err != nil {
		return err
	}
	switch cfg.Mode {
	case ModeCreate:
		if err := setupRootfs(&cfg); err != nil {
			return err
		}
		if cfg.SetHostname {
			if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
				return fmt.Errorf("setting hostname: %w", err)
			}
		}
	case ModeExec:
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unsharing fs attributes: %w", err)
		}
		if err := unix.Setns(MountNsFD, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("joining mount namespace: %w", err)
		}
		unix.Close(MountNsFD)
		if err := unix.Chdir("/"); err != nil {
			return fmt.Errorf("chdir /: %w", err)
		}
	default:
		return fmt.Errorf("unknown helper mode %q", cfg.Mode)
	}
	return execProcess(&cfg)
}

var rlimits = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}

func execProcess(cfg *Config) error {
	p := &cfg.Process
	lateSeccomp, err := setupProcess(cfg)
	if err != nil {
		return err
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := unix.Chdir(cwd); err != nil {
		return fmt.Errorf("chdir to cwd %q: %w", cwd, err)
	}
	path, f := LookPath(p.Args[0], PathFromEnv(p.Env))
	if f != nil {
		return f
	}
	if cfg.Mode == ModeCreate {
		sync := os.NewFile(SyncFD, "sync")
		if _, err := sync.Write(Message{Type: MsgReady}.Marshal()); err != nil {
			return fmt.Errorf("reporting ready: %w", err)
		}
		start := os.NewFile(StartFD, "start")
		b := make([]byte, 1)
		if n, err := start.Read(b); n != 1 {
			if err == nil || err == io.EOF {
				err = errors.New("start pipe closed")
			}
			return fmt.Errorf("waiting for start: %w", err)
		}
		start.Close()
	}
	if lateSeccomp != nil {
		if err := lateSeccomp.Load(); err != nil {
			return err
		}
	}
	err = syscall.Exec(path, p.Args, p.Env)
	return execFailure(path, err)
}

// ReadMessage reads one sync message; io.EOF means the helper exec'd (or
// died without a word).
func ReadMessage(r *bufio.Reader) (Message, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if err == io.EOF && strings.TrimSpace(line) == "" {
			return Message{}, io.EOF
		}
		if err != io.EOF {
			return Message{}, err
		}
	}
	var m Message
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		return Message{}, fmt.Errorf("parsing helper message %q: %w", line, err)
	}
	return m, nil
}
