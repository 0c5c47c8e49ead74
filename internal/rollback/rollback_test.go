package rollback

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestUnwindRunsInReverseAndJoinsErrors(t *testing.T) {
	var s Stack
	var order []string
	s.Add("a", func() error { order = append(order, "a"); return nil })
	s.Add("b", func() error { order = append(order, "b"); return errors.New("boom") })
	s.Add("c", func() error { order = append(order, "c"); return nil })
	err := s.Unwind()
	if !reflect.DeepEqual(order, []string{"c", "b", "a"}) {
		t.Fatalf("order = %v, want c b a", order)
	}
	if err == nil || !strings.Contains(err.Error(), "releasing b: boom") {
		t.Fatalf("err = %v, want it to name b", err)
	}
	if err := s.Unwind(); err != nil || len(order) != 3 {
		t.Fatalf("second unwind ran steps again: %v %v", order, err)
	}
}

func TestReleaseForgetsSteps(t *testing.T) {
	var s Stack
	ran := false
	s.Add("x", func() error { ran = true; return nil })
	s.Release()
	if err := s.Unwind(); err != nil || ran {
		t.Fatalf("released step ran: %v %v", ran, err)
	}
}
