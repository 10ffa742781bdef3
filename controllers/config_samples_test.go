package controllers

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
)

// Every sample renders a runtime config the runtime accepts, for the
// database it names: a MySQL sample as sink.kind mysql with its database as
// the schema and its DSN in IDC_MYSQL_DSN, and its sql statement one the
// MySQL dialect compiles (its :name parameters all mapped).
func TestEverySampleRendersForItsSinkDatabase(t *testing.T) {
	files, err := filepath.Glob("../config/samples/messaging_*.yaml")
	if err != nil || len(files) < 10 {
		t.Fatalf("samples: %v %v", files, err)
	}
	kinds := map[config.SinkKind]int{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		idc := &messagingv1alpha1.IdempotentConsumer{}
		if err := yaml.UnmarshalStrict(raw, idc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		idc.Namespace = "default"
		rc, err := renderConfig(idc)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		s := rc.Config.Sink
		kinds[s.DatabaseKind()]++
		dsn := slices.IndexFunc(rc.Secrets, func(e specs.SecretEnv) bool { return e.Env == s.DSNEnv })
		if s.Schema != idc.Spec.Sink.Schema() || dsn < 0 || rc.Secrets[dsn].Ref != idc.Spec.Sink.ConnectionSecretRef() {
			t.Errorf("%s: schema %q, dsnEnv %s, secrets %+v", f, s.Schema, s.DSNEnv, rc.Secrets)
		}
		if idc.Spec.Sink.MySQL == nil {
			continue
		}
		if s.Kind != config.SinkMySQL || s.DSNEnv != envMySQLDSN || s.Schema != string(idc.Spec.Sink.MySQL.Database) {
			t.Errorf("%s: sink %+v", f, s)
		}
		if q := s.Effect.SQL; q != nil {
			_, names, err := effect.ConvertNamedParamsMySQL(q.Statement)
			if err != nil {
				t.Errorf("%s: the MySQL dialect refuses the statement: %v", f, err)
			}
			for _, n := range names {
				if _, ok := q.Params[n]; !ok {
					t.Errorf("%s: :%s is not among params", f, n)
				}
			}
		}
	}
	if kinds[config.SinkPostgres] == 0 || kinds[config.SinkMySQL] < 3 {
		t.Errorf("samples per sink database: %v", kinds)
	}
}
