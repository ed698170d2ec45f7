"""The dispatcher component: claims due steps, calls products, records what they answered."""
