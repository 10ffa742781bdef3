package main

import (
	"debug/buildinfo"
	"os"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// bomOf lists the modules of the running test binary's build info as
// cyclonedx-gomod would, leaving out drop.
func bomOf(t *testing.T, drop string) (string, *cdx.BOM) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Deps) == 0 {
		t.Fatal("the test binary's build info lists no dependencies")
	}
	var cs []cdx.Component
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		if d.Path != drop {
			cs = append(cs, cdx.Component{Name: d.Path, Version: d.Version})
		}
	}
	return exe, &cdx.BOM{Metadata: &cdx.Metadata{Component: &cdx.Component{Name: info.Main.Path}}, Components: &cs}
}

func TestCheckAcceptsEveryModule(t *testing.T) {
	exe, bom := bomOf(t, "")
	if err := check(exe, bom); err != nil {
		t.Fatal(err)
	}
}

func TestCheckRefusesAMissingModule(t *testing.T) {
	const mod = "github.com/CycloneDX/cyclonedx-go"
	exe, bom := bomOf(t, mod)
	err := check(exe, bom)
	if err == nil || !strings.Contains(err.Error(), mod) {
		t.Fatalf("check with %s left out: %v; want an error naming it", mod, err)
	}
}

func TestCheckRefusesAnotherVersion(t *testing.T) {
	exe, bom := bomOf(t, "")
	(*bom.Components)[0].Version = "v0.0.0-wrong"
	if err := check(exe, bom); err == nil || !strings.Contains(err.Error(), "v0.0.0-wrong") {
		t.Fatalf("check with a wrong version: %v", err)
	}
}

func TestImageBOMNamesEveryBinary(t *testing.T) {
	mods := []cdx.Component{{Name: "m", Version: "v1", BOMRef: "pkg:golang/m@v1"}}
	bin := &cdx.BOM{Metadata: &cdx.Metadata{Component: &cdx.Component{Name: "x", Version: "v0.2.0"}}, Components: &mods}
	bom := imageBOM("idc-operator:0.2.0", "sha256:ab", []cdx.Component{application("manager", bin), application("idc-runtime", bin)})
	if bom.SerialNumber != "" || bom.Metadata.Timestamp != "" {
		t.Errorf("serial %q timestamp %q: the same build must give the same bytes", bom.SerialNumber, bom.Metadata.Timestamp)
	}
	if got := (*bom.Components)[1].Components; got == nil || (*got)[0].BOMRef != "idc-runtime:pkg:golang/m@v1" {
		t.Errorf("the second binary's modules: %+v", got)
	}
	if deps := *(*bom.Dependencies)[0].Dependencies; len(deps) != 2 {
		t.Errorf("the image depends on %v", deps)
	}
}
