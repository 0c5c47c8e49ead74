/*
 * hull-pause is the process of a pod's sandbox container in Hull's guest
 * (docs/sandbox.md). It holds the sandbox's namespaces, reaps the orphans
 * of a pod that shares its pid namespace, and exits 0 on SIGINT or
 * SIGTERM from outside that namespace (the agent), as Kubernetes' pause
 * does; a container of the pod cannot end it with them.
 *
 * Usage: pause UID GID [GID...], started by the agent as root in new
 * mount, pid, ipc and uts namespaces, with the pause's own directory (a
 * read-only mount holding only this file) as its working directory. It
 * makes that directory its root and detaches the rest of the guest's
 * mounts, becomes the spec's user, gives up every capability and sets
 * no_new_privs: a container that reaches it (/proc/1/root, /proc/1/ns/mnt
 * in a pod sharing its pid namespace) finds nothing of the guest.
 *
 * Descriptors from the agent: 3, the start pipe (a byte: run; end of file:
 * the container was removed before it started); 4, the sync pipe, on
 * which it writes one NUL byte once it waits to start, or why it failed
 * (then it exits 1), and which it closes once started: the agent reads
 * that as the command's successful start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_GROUPS 64

/* A sender outside the pause's pid namespace has no pid in it: 0. */
static void quit(int sig, siginfo_t *info, void *ctx)
{
	(void)sig;
	(void)ctx;
	if (info->si_pid == 0)
		_exit(0);
}

static void reap(int sig)
{
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

static int fail(const char *what)
{
	dprintf(4, "pause: %s: %s", what, errno ? strerror(errno) : "invalid arguments");
	return 1;
}

static int parse_id(const char *s, unsigned int *id)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno != 0 || *s == '\0' || *end != '\0' || v > UINT_MAX - 1) {
		errno = EINVAL;
		return -1;
	}
	*id = (unsigned int)v;
	return 0;
}

/* The working directory becomes / and the old root goes (runc's
 * pivot_root(".", ".")); propagation is private first so that the detach
 * stays in this namespace. */
static int enter_root(void)
{
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		return -1;
	if (syscall(SYS_pivot_root, ".", ".") != 0)
		return -1;
	if (umount2(".", MNT_DETACH) != 0)
		return -1;
	return chdir("/");
}

int main(int argc, char **argv)
{
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {{0}};
	unsigned int uid, gid;
	gid_t groups[MAX_GROUPS];
	struct sigaction sa = {0};
	char go;
	int n = 0;

	errno = 0;
	if (argc < 3 || argc - 3 > MAX_GROUPS)
		return fail("usage: pause UID GID [GID...]");
	if (parse_id(argv[1], &uid) != 0 || parse_id(argv[2], &gid) != 0)
		return fail("user");
	for (int i = 3; i < argc; i++, n++) {
		unsigned int g;
		if (parse_id(argv[i], &g) != 0)
			return fail("additional group");
		groups[n] = g;
	}

	sigemptyset(&sa.sa_mask);
	sa.sa_sigaction = quit;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
		return fail("sigaction");
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) != 0)
		return fail("sigaction");

	if (enter_root() != 0)
		return fail("entering the pause directory");
	/* The bounding set shrinks only with CAP_SETPCAP, so before the user
	 * changes; everything else after. */
	for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
			return fail("dropping the bounding set");
	if (setgroups(n, groups) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
		return fail("becoming the spec's user");
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 ||
	    syscall(SYS_capset, &hdr, none) != 0)
		return fail("dropping capabilities");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return fail("setting no_new_privs");

	if (write(4, "", 1) != 1)
		return 1;
	if (read(3, &go, 1) != 1)
		return 1;
	close(3);
	close(4);
	for (;;)
		pause();
}
