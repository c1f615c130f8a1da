package server

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// openapiJSON is the OpenAPI 3.0.3 document of the API. openapi_test.go
// checks that its operations are exactly the routes routes() registers.
//
//go:embed openapi.json
var openapiJSON []byte

// openapi: GET /v1/openapi.json (no authentication).
func (s *Server) openapi(c *gin.Context) {
	c.Data(http.StatusOK, "application/json", openapiJSON)
}
