package integration

import (
	"errors"
	"os"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
)

// TestMain starts the suite's NATS server: the current nats-server unless
// IDC_TEST_NATS picks the machine's (internal/natstest).
func TestMain(m *testing.M) {
	os.Exit(natstest.Main(m, natstest.Current, func(s []*natstest.Server) error {
		if len(s) != 1 {
			return errors.New("the integration suite runs against one NATS server at a time: IDC_TEST_NATS=current or system")
		}
		natsURL = s[0].URL
		return nil
	}))
}
