package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// memory is what the manager keeps per resource between passes, safe for
// concurrent workers: the broker reading, the sink checks' snapshot, what
// was last applied of each child and which Secrets the last pass read,
// with the data of those Secrets. forget drops all of it when the resource
// is gone; nothing else outlives a resource.
type memory struct {
	mu        sync.Mutex
	resources map[types.NamespacedName]*remembered
	// secrets holds the data of the Secrets some resource's last pass
	// read, by resourceVersion (see readSecret); secretUsers counts the
	// resources whose last pass read each, and a Secret is dropped with its
	// last user, so no credential outlives its use. It holds what the sink
	// pools already hold (the values the manager connects with).
	secrets     map[types.NamespacedName]*corev1.Secret
	secretUsers map[types.NamespacedName]int
}

// remembered is what the manager keeps of one resource.
type remembered struct {
	// reading is the last broker reading (brokerPhase).
	reading *brokerReading
	// sink is the last complete, successful sink checks' snapshot
	// (the sink memo).
	sink *sinkSnapshot
	// applied is the last apply of each child by this process, by
	// "Kind/name" (apply).
	applied map[string]appliedChild
	// secrets are the Secrets the resource's last pass read.
	secrets map[types.NamespacedName]bool
}

func newMemory() *memory {
	return &memory{resources: map[types.NamespacedName]*remembered{},
		secrets: map[types.NamespacedName]*corev1.Secret{}, secretUsers: map[types.NamespacedName]int{}}
}

// of is key's record, created when missing. The caller holds mu.
func (m *memory) of(key types.NamespacedName) *remembered {
	r, ok := m.resources[key]
	if !ok {
		r = &remembered{}
		m.resources[key] = r
	}
	return r
}

// forget drops everything kept of a resource that is gone, and the data of
// the Secrets no other resource uses: a deleted resource's credentials
// leave the heap with it.
func (m *memory) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.resources[key]; ok {
		for s := range r.secrets {
			m.releaseSecret(s)
		}
	}
	delete(m.resources, key)
}

func (m *memory) reading(key types.NamespacedName) *brokerReading {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.resources[key]; ok {
		return r.reading
	}
	return nil
}

func (m *memory) putReading(key types.NamespacedName, b *brokerReading) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.of(key).reading = b
}

func (m *memory) sinkSnapshot(key types.NamespacedName) (sinkSnapshot, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.resources[key]; ok && r.sink != nil {
		return *r.sink, true
	}
	return sinkSnapshot{}, false
}

func (m *memory) putSinkSnapshot(key types.NamespacedName, snap sinkSnapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.of(key).sink = &snap
}

// dropSinkSnapshot drops the kept sink checks: the next pass checks afresh.
func (m *memory) dropSinkSnapshot(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.resources[key]; ok {
		r.sink = nil
	}
}

func (m *memory) appliedChild(owner types.NamespacedName, child string) (appliedChild, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.resources[owner]; ok {
		c, ok := r.applied[child]
		return c, ok
	}
	return appliedChild{}, false
}

func (m *memory) putAppliedChild(owner types.NamespacedName, child string, c appliedChild) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.of(owner)
	if r.applied == nil {
		r.applied = map[string]appliedChild{}
	}
	r.applied[child] = c
}

// forgetChild drops what was applied of a child that was deleted.
func (m *memory) forgetChild(owner types.NamespacedName, child string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.resources[owner]; ok {
		delete(r.applied, child)
	}
}

// useSecrets records that owner's last pass read exactly the Secrets in
// secrets; those it no longer uses, and no one else does, are dropped. A
// Secret read but not found (or not remembered) has no data here; its
// users are kept so the next read is remembered for them.
func (m *memory) useSecrets(owner types.NamespacedName, secrets map[types.NamespacedName]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.of(owner)
	for s := range r.secrets {
		if !secrets[s] {
			m.releaseSecret(s)
		}
	}
	for s := range secrets {
		if !r.secrets[s] {
			m.secretUsers[s]++
		}
	}
	if len(secrets) == 0 {
		r.secrets = nil
		return
	}
	mine := make(map[types.NamespacedName]bool, len(secrets))
	for s := range secrets {
		mine[s] = true
	}
	r.secrets = mine
}

// releaseSecret drops one user of a Secret, and its data with the last
// one. The caller holds mu.
func (m *memory) releaseSecret(key types.NamespacedName) {
	m.secretUsers[key]--
	if m.secretUsers[key] <= 0 {
		delete(m.secretUsers, key)
		delete(m.secrets, key)
	}
}

// secret is the kept Secret when it is at resourceVersion.
func (m *memory) secret(key types.NamespacedName, resourceVersion string) (*corev1.Secret, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sec, ok := m.secrets[key]
	if !ok || resourceVersion == "" || sec.ResourceVersion != resourceVersion {
		return nil, false
	}
	return sec, true
}

func (m *memory) putSecret(key types.NamespacedName, sec *corev1.Secret) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Only what the passes read: no managed fields, labels or annotations.
	m.secrets[key] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sec.Namespace, Name: sec.Name, UID: sec.UID,
		ResourceVersion: sec.ResourceVersion}, Data: sec.Data}
}

// dropSecret drops the data of a Secret found gone; its users are kept.
func (m *memory) dropSecret(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.secrets, key)
}

// heldSecrets lists the Secrets whose data is kept.
func (m *memory) heldSecrets() []types.NamespacedName {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(m.secrets))
	for k := range m.secrets {
		out = append(out, k)
	}
	return out
}

// size is how many resources have a record and how many Secrets have
// users, for telling that forget left nothing behind.
func (m *memory) size() (resources, secretUsers int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.resources), len(m.secretUsers)
}
