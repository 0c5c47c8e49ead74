// Package critest runs the CRI validation suite (critest, cri-tools
// v1.37.0, built by hack/build-compat.sh) against runc and Hull on one
// private containerd (HULL_CONTAINERD selects the version), offline: the
// images critest pulls are built from the host's busybox and imported
// under the names it asks for. See docs/e2e-critest.md.
package critest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// The images of the specs this package runs (pkg/validate and
// pkg/framework of cri-tools v1.37.0).
const (
	e2eImages      = "registry.k8s.io/e2e-test-images/"
	busyboxImage   = e2eImages + "busybox:1.29-2" // DefaultLinuxContainerImage
	nginxImage     = e2eImages + "nginx:1.14-2"   // web server, PID namespace specs
	httpdImage     = e2eImages + "httpd:2.4.39-4" // Multiple Containers
	noNewPrivImage = e2eImages + "nonewprivs:1.3" // NoNewPrivs: a setuid-root binary
	// hostNetNginxImage is nginx on port 12003 (cri-tools'
	// images/hostnet-nginx), for port-forward in the host network.
	hostNetNginxImage = "gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest"
	// predefinedGroupImage runs as uid 1000, which /etc/group puts in
	// group 50000 (cri-tools' images/image-predefined-group).
	predefinedGroupImage = "gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest"
)

// Applets critest's specs run that Debian's busybox-static lacks, as
// scripts in the busybox image: `pgrep sleep` (execSync timeout) and
// `ipcs -m` (HostIpc).
const (
	pgrepScript = `#!/bin/sh
# pgrep PATTERN: the pids whose name matches PATTERN.
st=1
for d in /proc/[0-9]*; do
	read -r name 2>/dev/null <"$d/comm" || continue
	if echo "$name" | grep -q -- "$1"; then echo "${d#/proc/}"; st=0; fi
done
exit $st
`
	ipcsScript = `#!/bin/sh
# ipcs -m: the shared memory segments of the IPC namespace.
echo "------ Shared Memory Segments --------"
echo "key shmid owner perms bytes nattch"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size cpid lpid nattch uid rest; do
	echo "$key $shmid $uid $perms $size $nattch"
done
`
)

// tools are the small programs of testdata the images need, built static.
type tools struct{ nnp, nginx []byte }

// critestImages builds the images from busybox and the tools.
func critestImages(t tools) []harness.Image {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	nginxFiles := []harness.File{
		{Path: "usr/sbin/nginx", Mode: 0o755, Body: t.nginx},
		{Path: "usr/share/nginx/html/index.html", Mode: 0o644, Body: []byte("<html><body>Welcome to nginx!</body></html>\n")},
	}
	nginx := []string{"/usr/sbin/nginx", "-g", "daemon off; master process"}
	return []harness.Image{
		{Ref: busyboxImage, Cmd: []string{"sh"}, Env: env, WorkingDir: "/", Files: []harness.File{
			{Path: "usr/bin/pgrep", Mode: 0o755, Body: []byte(pgrepScript)},
			{Path: "usr/bin/ipcs", Mode: 0o755, Body: []byte(ipcsScript)},
		}},
		{Ref: nginxImage, Entrypoint: nginx, Env: env, WorkingDir: "/", Files: nginxFiles},
		{Ref: hostNetNginxImage, Entrypoint: []string{"/usr/sbin/nginx", "-listen", ":12003", "-g", "daemon off; master process"}, Env: env, WorkingDir: "/", Files: nginxFiles},
		// The spec looks for "httpd" in the container's log.
		{Ref: httpdImage, Entrypoint: []string{"sh", "-c", "echo 'httpd: serving /usr/local/apache2/htdocs on port 80' >&2; exec httpd -f -p 80 -h /usr/local/apache2/htdocs"}, Env: env, WorkingDir: "/",
			Files: []harness.File{{Path: "usr/local/apache2/htdocs/index.html", Mode: 0o644, Body: []byte("<html><body><h1>It works!</h1></body></html>\n")}}},
		{Ref: predefinedGroupImage, Cmd: []string{"sh"}, Env: env, WorkingDir: "/", User: "1000", Files: []harness.File{
			{Path: "etc/passwd", Mode: 0o644, Body: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\ndefault-user:x:1000:1000::/home/default-user:/bin/sh\n")},
			{Path: "etc/group", Mode: 0o644, Body: []byte("root:x:0:\nnogroup:x:65534:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")},
		}},
		{Ref: noNewPrivImage, Entrypoint: []string{"/usr/local/bin/nnp"}, Env: env, WorkingDir: "/",
			Files: []harness.File{{Path: "usr/local/bin/nnp", Mode: 0o4755, Body: t.nnp}}},
	}
}

// buildTools compiles testdata/nnp and testdata/nginx in dir.
func buildTools(dir string) (tools, error) {
	var t tools
	for name, dst := range map[string]*[]byte{"nnp": &t.nnp, "nginx": &t.nginx} {
		b, err := buildTool(dir, name)
		if err != nil {
			return t, err
		}
		*dst = b
	}
	return t, nil
}

// buildTool compiles testdata/NAME as a static binary in dir.
func buildTool(dir, name string) ([]byte, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building testdata/%s: %w: %s", name, err, b)
	}
	return os.ReadFile(out)
}
