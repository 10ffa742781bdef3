package retention

import (
	"os"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
)

// TestMain starts the package's NATS server: the current nats-server unless
// IDC_TEST_NATS picks the machine's (internal/natstest).
func TestMain(m *testing.M) {
	os.Exit(natstest.MainOne(m, "retention", &natsURL))
}
