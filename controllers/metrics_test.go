package controllers

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The phase-duration metric's help names every phase of the phase list,
// in its order: a phase added to the list without it fails here.
func TestPhaseMetricNamesEveryPhase(t *testing.T) {
	var names []string
	for _, p := range (&Reconciler{}).phases() {
		names = append(names, p.name)
	}
	want := "(" + strings.Join(names, ", ") + ")"
	descs := make(chan *prometheus.Desc, 1)
	phaseSeconds.Describe(descs)
	if d := (<-descs).String(); !strings.Contains(d, want) {
		t.Fatalf("the phase-duration help %s does not name the phases %s", d, want)
	}
}

// Importing the package registers nothing; RegisterMetrics registers every
// controller-wide metric once.
func TestRegisterMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	RegisterMetrics(reg)
	statusPatches.Add(0)
	if n, err := testutil.GatherAndCount(reg, "idc_controller_status_patches_total"); err != nil || n != 1 {
		t.Fatalf("status patches gathered %d times (%v), want once", n, err)
	}
	for _, c := range controllerMetrics {
		if err := reg.Register(c); err == nil {
			t.Fatalf("%v was not registered by RegisterMetrics", c)
		}
	}
}
