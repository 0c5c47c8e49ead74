package qemu

import (
	"fmt"
	"reflect"
	"testing"
)

func TestConsoleTailKeepsTheLastLinesInOrder(t *testing.T) {
	var c consoleTail
	for i := 0; i < 3; i++ {
		c.add(fmt.Sprint(i))
	}
	if got := c.last(5); !reflect.DeepEqual(got, []string{"0", "1", "2"}) {
		t.Fatalf("last(5) = %v", got)
	}
	for i := 3; i < consoleKeep+7; i++ {
		c.add(fmt.Sprint(i))
	}
	want := []string{fmt.Sprint(consoleKeep + 4), fmt.Sprint(consoleKeep + 5), fmt.Sprint(consoleKeep + 6)}
	if got := c.last(3); !reflect.DeepEqual(got, want) {
		t.Fatalf("last(3) = %v, want %v", got, want)
	}
	if got := c.last(1000); len(got) != consoleKeep || got[0] != "7" {
		t.Fatalf("last(1000) = %d lines from %q", len(got), got[0])
	}
}
