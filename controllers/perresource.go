package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// perResource is what the manager keeps per resource between passes (the
// broker reading, the sink checks), safe for concurrent workers; forget
// drops it when the resource is gone.
type perResource[T any] struct {
	mu sync.Mutex
	m  map[types.NamespacedName]T
}

func newPerResource[T any]() *perResource[T] {
	return &perResource[T]{m: map[types.NamespacedName]T{}}
}

func (p *perResource[T]) get(key types.NamespacedName) (T, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[key]
	return v, ok
}

func (p *perResource[T]) put(key types.NamespacedName, v T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[key] = v
}

func (p *perResource[T]) forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, key)
}
