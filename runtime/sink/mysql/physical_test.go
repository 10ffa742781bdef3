package mysql_test

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

var physicalRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/`)

// The identity is minted once per database: many pools asking at once for
// the first time agree on it, it is the database's (another database on
// the same server has its own), and a pool opened later reads the same.
func TestPhysicalDatabaseIsMintedOnce(t *testing.T) {
	ctx := context.Background()
	name, dsn := mysqltest.NewDatabase(t)
	other, _ := mysqltest.NewDatabase(t)
	const pools = 6
	got := make([]string, pools)
	var wg sync.WaitGroup
	for i := range pools {
		d, err := mysql.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := d.PhysicalDatabase(ctx, config.Sink{Schema: name})
			if err != nil {
				t.Error(err)
			}
			got[i] = id
		}()
	}
	wg.Wait()
	for i, id := range got {
		if id != got[0] || !physicalRE.MatchString(id) || !strings.HasSuffix(id, "/"+name) {
			t.Fatalf("pool %d names %q, pool 0 %q; want one <uuid>/%s", i, id, got[0], name)
		}
	}
	later, err := mysql.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(later.Close)
	if id, err := later.PhysicalDatabase(ctx, config.Sink{Schema: name}); err != nil || id != got[0] {
		t.Fatalf("a later pool names %q, %v; want %q", id, err, got[0])
	}
	o, err := later.PhysicalDatabase(ctx, config.Sink{Schema: other})
	if err != nil || !physicalRE.MatchString(o) || strings.Split(o, "/")[0] == strings.Split(got[0], "/")[0] {
		t.Fatalf("database %s names %q, %v; want its own identity, not %q's", other, o, err, got[0])
	}
}
