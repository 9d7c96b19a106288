"""Report builders."""
