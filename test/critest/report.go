package critest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

// specResult is one spec of a ginkgo JSON report (-ginkgo.json-report).
type specResult struct {
	Name  string
	State string // passed, failed, skipped, pending, panicked, timedout, ...
}

// readReport returns the state of the leaf specs ("It") of a ginkgo JSON
// report by full name (the texts of their containers and their own,
// joined by spaces, as ginkgo prints them), and the failure message of
// those that did not pass.
func readReport(file string) (states map[string]string, failures map[string]string, err error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	var suites []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			Failure                 struct{ Message string }
		}
	}
	if err := json.Unmarshal(b, &suites); err != nil {
		return nil, nil, fmt.Errorf("reading ginkgo report %s: %w", file, err)
	}
	states, failures = map[string]string{}, map[string]string{}
	for _, s := range suites {
		for _, r := range s.SpecReports {
			if r.LeafNodeType != "It" {
				continue
			}
			name := strings.Join(append(slices.Clone(r.ContainerHierarchyTexts), r.LeafNodeText), " ")
			states[name] = r.State
			if msg := strings.TrimSpace(r.Failure.Message); msg != "" && r.State != "skipped" && r.State != "passed" {
				if len(msg) > 400 {
					msg = msg[:400] + "..."
				}
				failures[name] = msg
			}
		}
	}
	return states, failures, nil
}

// counts returns how many specs ran (were not skipped) and passed.
func counts(states map[string]string) (ran, passed int) {
	for _, st := range states {
		if st == "skipped" || st == "pending" {
			continue
		}
		ran++
		if st == "passed" {
			passed++
		}
	}
	return ran, passed
}

// exception is one line of exceptions.txt: a spec that may pass for runc
// and not for Hull, on the listed containerd versions ("all" for every
// one), and why.
type exception struct {
	Versions []string
	Spec     string
	Reason   string
	Line     int
}

func (e exception) appliesTo(version string) bool {
	return slices.Contains(e.Versions, "all") || slices.Contains(e.Versions, version)
}

// readExceptions parses exceptions.txt: "VERSIONS | SPEC | REASON" per
// line, VERSIONS "all" or a comma-separated list of HULL_CONTAINERD
// names; # starts a comment line.
func readExceptions(file string) ([]exception, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []exception
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, " | ")
		if len(f) != 3 || strings.TrimSpace(f[1]) == "" || strings.TrimSpace(f[2]) == "" {
			return nil, fmt.Errorf("%s:%d: want \"VERSIONS | SPEC | REASON\", got %q", file, n, line)
		}
		e := exception{Spec: strings.TrimSpace(f[1]), Reason: strings.TrimSpace(f[2]), Line: n}
		for _, v := range strings.Split(f[0], ",") {
			e.Versions = append(e.Versions, strings.TrimSpace(v))
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// verdict compares the runs: every spec that passed for runc and did not
// pass for Hull, with its exception if one applies to version; and the
// exceptions of version whose spec passed for Hull (to be removed).
func verdict(runc, hull map[string]string, exc []exception, version string) (unexcused []string, excused []exception, stale []exception) {
	byName := map[string]exception{}
	for _, e := range exc {
		if e.appliesTo(version) {
			byName[e.Spec] = e
		}
	}
	var names []string
	for n := range runc {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if runc[n] != "passed" || hull[n] == "passed" {
			continue
		}
		if e, ok := byName[n]; ok {
			excused = append(excused, e)
			continue
		}
		unexcused = append(unexcused, fmt.Sprintf("%s (hull: %s)", n, stateOf(hull, n)))
	}
	for _, e := range exc {
		if e.appliesTo(version) && hull[e.Spec] == "passed" {
			stale = append(stale, e)
		}
	}
	return unexcused, excused, stale
}

func stateOf(m map[string]string, n string) string {
	if s, ok := m[n]; ok {
		return s
	}
	return "not run"
}
