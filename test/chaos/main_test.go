package chaos

import (
	"os"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
)

// TestMain starts the suite's NATS server: the current nats-server unless
// IDC_TEST_NATS picks the machine's (internal/natstest).
func TestMain(m *testing.M) {
	os.Exit(natstest.MainOne(m, "chaos", &natsURL))
}
