package shim

import (
	"context"
	"sync"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/log"
)

// eventQueue publishes events in the order they were sent, from one
// goroutine, with the shim's namespace in the context (containerd drops
// events without one).
type eventQueue struct {
	pub events.Publisher
	ctx context.Context

	// mu guards closed and sends on ch.
	mu     sync.Mutex
	closed bool
	ch     chan any
	done   chan struct{}
}

func newEventQueue(ns string, pub events.Publisher) *eventQueue {
	q := &eventQueue{
		pub:  pub,
		ctx:  namespaces.WithNamespace(context.Background(), ns),
		ch:   make(chan any, 128),
		done: make(chan struct{}),
	}
	go q.run()
	return q
}

func (q *eventQueue) run() {
	defer close(q.done)
	for e := range q.ch {
		if err := q.pub.Publish(q.ctx, topic(e), e); err != nil {
			log.G(q.ctx).WithError(err).WithField("topic", topic(e)).Error("publishing event")
		}
	}
}

// send queues e; after close it is dropped.
func (q *eventQueue) send(e any) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.ch <- e
	}
}

// close stops accepting events and waits until the queued ones are
// published.
func (q *eventQueue) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
	q.mu.Unlock()
	<-q.done
}

func topic(e any) string {
	switch e.(type) {
	case *eventstypes.TaskCreate:
		return runtime.TaskCreateEventTopic
	case *eventstypes.TaskStart:
		return runtime.TaskStartEventTopic
	case *eventstypes.TaskOOM:
		return runtime.TaskOOMEventTopic
	case *eventstypes.TaskExit:
		return runtime.TaskExitEventTopic
	case *eventstypes.TaskDelete:
		return runtime.TaskDeleteEventTopic
	case *eventstypes.TaskExecAdded:
		return runtime.TaskExecAddedEventTopic
	case *eventstypes.TaskExecStarted:
		return runtime.TaskExecStartedEventTopic
	case *eventstypes.TaskPaused:
		return runtime.TaskPausedEventTopic
	case *eventstypes.TaskResumed:
		return runtime.TaskResumedEventTopic
	}
	return runtime.TaskUnknownTopic
}
